"""What users hold: ``RateLimit`` (:mod:`.limiter`) and what it hands out (:mod:`.limiting`),
the ``Limit`` of ``limit()`` (:mod:`.limit`) and the ``Concurrency`` of ``concurrency()``
(:mod:`.concurrency`, reserved slots in :mod:`.reserve`), what their decorators share
(:mod:`.wrapping`), the direct and fused paths a plain decorated limit takes
(:mod:`.direct`, :mod:`.fused`), rules chosen per call (:mod:`.chosen`) and rules registered
under a ``key=`` (:mod:`.registry`).
"""
