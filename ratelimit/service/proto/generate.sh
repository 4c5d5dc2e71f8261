#!/usr/bin/env sh
# Regenerate the checked-in protobuf and gRPC modules (and their typed stubs) from the .proto
# files here. Needs: pip install grpcio-tools mypy-protobuf
set -eu
cd "$(dirname "$0")/../../.."
proto=ratelimit/service/proto
python3 -m grpc_tools.protoc -I . --python_out=. --mypy_out=. \
  $proto/ratio.proto $proto/envoy/common.proto $proto/envoy/core.proto $proto/envoy/rls.proto
python3 -m grpc_tools.protoc -I . --grpc_python_out=. --mypy_grpc_out=. \
  $proto/ratio.proto $proto/envoy/rls.proto
touch $proto/__init__.py $proto/envoy/__init__.py
