"""Redis as envoyproxy/ratelimit uses it: connected as its settings say
(:mod:`.connection`), its fixed windows counted on its own keys (:mod:`.windows`), so that
``ratelimit serve --envoy`` shares a fleet's counters with its service."""
