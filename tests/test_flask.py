"""The Flask helper (``ratelimit.flask``): app-wide routes, view limits reading the
request's values, refusals answered as 429 (never Flask's 500), checked when made; through
Flask's test client, which calls the application's WSGI callable (the middleware)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import flask
import pytest
from flask import Blueprint, Flask, g

from ratelimit import ConfigurationError, MemoryBackend, RateLimitExceeded, RuleSyntaxError
from ratelimit import RateLimit as AsyncRateLimit
from ratelimit.asgi import HTTPRequest
from ratelimit.core.decision import Decision
from ratelimit.flask import FlaskRateLimit, Route, header, json_field, path_param, user
from ratelimit.sync import RateLimit
from tests.conftest import FailingBackend
from tests.test_wsgi import sf_list

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rl() -> Iterator[RateLimit]:
    limiter = RateLimit(MemoryBackend())
    yield limiter
    limiter.close()


def statuses(client: Any, path: str, n: int, **options: Any) -> list[int]:
    return [client.open(path, **options).status_code for _ in range(n)]


def test_app_wide_routes_and_exclusions(rl: RateLimit) -> None:
    app = Flask(__name__)
    FlaskRateLimit(rl, app, routes=[Route("/ping", "ip:2/m")], exclude=["/health"])
    app.add_url_rule("/ping", "ping", lambda: "pong")
    app.add_url_rule("/health", "health", lambda: "ok")
    client = app.test_client()
    answers = [client.get("/ping") for _ in range(3)]
    health = client.get("/health")
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert sf_list(answers[0].headers["RateLimit"]) == {"ip:2/m": {"r": 1, "t": 60}}
    assert answers[2].headers["Content-Type"] == "application/problem+json"
    assert answers[2].headers["Retry-After"] == "60"
    assert answers[2].json["violated-policies"] == ["ip:2/m"]  # type: ignore[index]
    assert health.status_code == 200
    assert "RateLimit" not in health.headers


def test_a_route_and_a_view_limit_on_one_view_keep_counters_of_their_own(
    rl: RateLimit,
) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app, routes=[Route("/page", "ip:10/m", methods=["GET"])])

    @app.get("/page")
    @limits.limit("ip:3/m")
    def page() -> str:
        return "ok"

    assert statuses(app.test_client(), "/page", 4) == [200, 200, 200, 429]


def test_a_view_limit_reads_the_json_body_and_counts_per_value(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)
    ran: list[str] = []

    @app.post("/login")
    @limits.limit("username:2/m", username=json_field("username"))
    def login() -> dict[str, object]:
        ran.append(str((flask.request.get_json(silent=True) or {}).get("username")))
        return {"left": g.ratelimit.remaining}

    client = app.test_client()
    ann = [client.post("/login", json={"username": "ann"}) for _ in range(3)]
    bob = client.post("/login", json={"username": "bob"})
    nobody = statuses(client, "/login", 3, method="POST", data="not json")  # no value: unlimited
    assert [a.status_code for a in ann] == [200, 200, 429]
    assert [a.json for a in ann[:2]] == [{"left": 1}, {"left": 0}]
    assert ran[:2] == ["ann", "ann"]  # the refused call never ran the view
    assert ann[2].json["detail"].startswith("rate limit exceeded (username:2/m)")  # type: ignore[index]
    assert sf_list(ann[2].headers["RateLimit-Policy"]) == {"username:2/m": {"q": 2, "w": 60}}
    assert ann[2].headers["Retry-After"] == "60"
    assert bob.status_code == 200
    assert nobody == [200, 200, 200]


def test_view_key_is_the_url_rule_and_head_counts_as_get(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)
    seen: list[str] = []

    @app.get("/items/<int:item>")
    @limits.limit("item:2/m", item=path_param("item"))
    def item(item: int) -> str:
        seen.append(g.ratelimit.key)
        return "item"

    client = app.test_client()
    one = [client.get("/items/1").status_code, client.head("/items/1").status_code]
    assert one == [200, 200]
    assert client.get("/items/1").status_code == 429  # HEAD took the second
    assert client.get("/items/2").status_code == 200
    assert seen[0] == "view GET /items/<int:item>"


def test_a_blueprint_views_key_holds_its_prefix(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)
    api = Blueprint("api", __name__, url_prefix="/v1")

    @api.get("/ping")
    @limits.limit("2/m")
    def ping() -> str:
        return g.ratelimit.key  # type: ignore[no-any-return]

    app.register_blueprint(api)
    client = app.test_client()
    assert client.get("/v1/ping").text == "view GET /v1/ping"
    assert statuses(client, "/v1/ping", 2) == [200, 429]


def test_a_refusal_raised_inside_a_view_is_a_429_not_a_500(rl: RateLimit) -> None:
    app = Flask(__name__)  # not testing: Flask turns unhandled exceptions into 500
    FlaskRateLimit(rl, app)

    @rl.limit("2/m", key="export")
    def export() -> str:
        return "data"

    @rl.concurrency("1", key="report")
    def report() -> str:
        return "report"

    app.add_url_rule("/export", "export", export)

    @app.get("/report")
    def nested() -> str:
        with rl.concurrency("1", key="report"):
            return report()  # the slot is held: refused

    client = app.test_client()
    answers = [client.get("/export") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].headers["Retry-After"] == "60"
    assert sf_list(answers[2].headers["RateLimit"]) == {"2/m": {"r": 0, "t": 60}}
    assert "RateLimit" not in answers[0].headers  # a plain function's admission: no header
    busy = client.get("/report")
    assert busy.status_code == 429
    assert busy.headers["Content-Type"] == "application/problem+json"


def test_unreadable_values_are_422_and_counted_nowhere(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)

    @app.post("/pay")
    @limits.limit("account:1/m", account=json_field("account", type=int))
    def pay() -> str:
        return "paid"

    client = app.test_client()
    junk = client.post("/pay", json={"account": "x"})
    assert junk.status_code == 422
    assert junk.headers["Content-Type"] == "application/problem+json"
    assert [client.post("/pay", json={"account": a}).status_code for a in (7, "07")] == [200, 429]


def test_shadow_mode_runs_the_view_and_reports(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)

    @app.get("/s")
    @limits.limit("1/m", shadow=True)
    def shadowed() -> str:
        return "allowed" if g.ratelimit.allowed else "over, in shadow"

    client = app.test_client()
    assert [client.get("/s").text for _ in range(2)] == ["allowed", "over, in shadow"]


@pytest.mark.parametrize(("on_error", "status"), [("deny", 503), ("allow", 200)])
def test_a_failing_store_follows_the_policy(on_error: str, status: int) -> None:
    limiter = RateLimit(FailingBackend(), on_error=on_error)
    try:
        app = Flask(__name__)
        limits = FlaskRateLimit(limiter, app, routes=[Route("/r", "ip:5/m")])
        app.add_url_rule("/r", "r", lambda: "route")

        @app.get("/v")
        @limits.limit("ip:5/m")
        def view() -> str:
            return "view"

        client = app.test_client()
        answers = [client.get("/r"), client.get("/v")]
    finally:
        limiter.close()
    assert [a.status_code for a in answers] == [status, status]
    if status == 503:
        assert answers[1].headers["Content-Type"] == "application/problem+json"


def test_the_view_reads_the_client_behind_trusted_proxies_only(rl: RateLimit) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app, trusted_proxies=["10.0.0.1"])

    @app.get("/ip")
    @limits.limit("ip:1/m")
    def ip() -> str:
        return "ip"

    client = app.test_client()
    spoof = {"X-Forwarded-For": "198.51.100.7"}
    direct = [client.get("/ip", headers=spoof, environ_base={"REMOTE_ADDR": "192.0.2.1"})]
    direct.append(client.get("/ip", headers={"X-Forwarded-For": "198.51.100.8"},
                             environ_base={"REMOTE_ADDR": "192.0.2.1"}))  # fmt: skip
    proxied = [
        client.get("/ip", headers={"X-Forwarded-For": f"6.6.6.{n}, 198.51.100.9"},
                   environ_base={"REMOTE_ADDR": "10.0.0.1"})
        for n in range(2)
    ]  # fmt: skip
    assert [a.status_code for a in direct] == [200, 429]  # counted on 192.0.2.1
    assert [a.status_code for a in proxied] == [200, 429]  # on 198.51.100.9, not 6.6.6.n


def test_a_refused_function_answers_with_its_own_body(rl: RateLimit) -> None:
    def refused(request: HTTPRequest, decision: Decision) -> Any:
        def application(environ: Any, start_response: Any) -> list[bytes]:
            start_response("429 Too Many Requests", [("Content-Type", "text/plain")])
            return [f"slow down, {request.client_ip}".encode()]

        return application

    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app, refused=refused)

    @app.get("/r")
    @limits.limit("1/m", key="own")
    def r() -> str:
        return "r"

    client = app.test_client()
    client.get("/r")
    answer = client.get("/r")
    assert answer.status_code == 429
    assert answer.text == "slow down, 127.0.0.1"
    assert answer.headers["Retry-After"] == "60"
    assert sf_list(answer.headers["RateLimit"]) == {"1/m": {"r": 0, "t": 60}}


def test_an_application_factory_and_user_values(rl: RateLimit) -> None:
    limits = FlaskRateLimit(rl)  # no application yet

    def create_app() -> Flask:
        app = Flask(__name__)
        limits.init_app(app)

        @app.get("/me")
        @limits.limit("who:1/m", who=user())
        def me() -> str:
            return "me"

        return app

    client = create_app().test_client()
    ann = {"REMOTE_USER": "ann"}
    assert [client.get("/me", environ_base=ann).status_code for _ in "ab"] == [200, 429]
    assert client.get("/me", environ_base={"REMOTE_USER": "bob"}).status_code == 200


def test_bad_configuration_fails_when_made(rl: RateLimit) -> None:
    app = Flask(__name__)
    with pytest.raises(TypeError, match=r"ratelimit\.sync\.RateLimit"):
        FlaskRateLimit(AsyncRateLimit(MemoryBackend()), app)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="starts with '/'"):
        FlaskRateLimit(rl, app, exclude=["health"])
    assert "ratelimit" not in app.extensions  # nothing half done
    limits = FlaskRateLimit(rl, app)
    with pytest.raises(ConfigurationError, match="init_app twice"):
        limits.init_app(app)
    with pytest.raises(TypeError, match="flask.Flask"):
        limits.init_app("app")  # type: ignore[arg-type]
    with pytest.raises(RuleSyntaxError, match="parsec"):
        limits.limit("10/parsec")
    with pytest.raises(ConfigurationError, match="apikey"):
        limits.limit("apikey:2/m", key_id=header("x"))  # a source for no selector
    with pytest.raises(ConfigurationError):
        limits.limit("2/m", cost=3)  # never admissible

    async def coroutine_view() -> str:
        return "x"

    with pytest.raises(TypeError, match="async view"):
        limits.limit("2/m")(coroutine_view)


def test_a_view_of_an_application_without_init_app_says_so(rl: RateLimit) -> None:
    limits = FlaskRateLimit(rl)
    app = Flask(__name__)

    @app.get("/v")
    @limits.limit("1/m")
    def v() -> str:
        return "v"

    app.testing = True  # the error reaches the test
    with pytest.raises(ConfigurationError, match="init_app"):
        app.test_client().get("/v")


def test_a_view_refusal_is_raised_as_rate_limit_exceeded_for_handlers_of_your_own(
    rl: RateLimit,
) -> None:
    app = Flask(__name__)
    limits = FlaskRateLimit(rl, app)

    @app.errorhandler(RateLimitExceeded)
    def mine(exc: RateLimitExceeded) -> tuple[str, int]:
        return f"mine: {exc.rule}", 429

    @app.get("/m")
    @limits.limit("1/m")
    def m() -> str:
        return "m"

    client = app.test_client()
    assert [client.get("/m").text for _ in "ab"] == ["m", "mine: 1/m"]
