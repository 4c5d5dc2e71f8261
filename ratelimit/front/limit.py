"""``Limit``: rules bound to a ``RateLimit``, as decorator, ``async with`` or methods."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, NoReturn, ParamSpec, TypeVar

from ratelimit.algorithms import Algorithm
from ratelimit.core.checks import check_cost, check_flag, check_lease
from ratelimit.core.costs import CallCost, CostLike, CostValue, per_leaf
from ratelimit.core.decision import Decision, HeldDecision, RateLimitExceeded
from ratelimit.core.plan import CompiledTree, Cost, compile_tree
from ratelimit.core.selectors import CallSite, Parameters, SelectorSources, resolve, resolved_now
from ratelimit.core.settling import CountWhen
from ratelimit.errors import ConfigurationError, SelectorNotFoundError
from ratelimit.front.chosen import UNRESOLVED, Chooser, ChosenRules, RulesLike
from ratelimit.front.decorator import UNANSWERED, decorate
from ratelimit.front.direct import Direct
from ratelimit.front.fused import DirectPaths, direct_paths
from ratelimit.front.keywords import LIMIT_OWN, check_selector_keywords
from ratelimit.front.registry import Registration, Registry
from ratelimit.front.wrapping import findable, function_name, wrappable
from ratelimit.overrides.cache import Override, OverrideCache
from ratelimit.overrides.lowered import Never, Overriding, never, refusing
from ratelimit.penalties.penalizer import NOT_NAMED, Found, penalizer_for
from ratelimit.pipeline.decider import CallKey, Decider, new_call_key
from ratelimit.pipeline.waiting import admitted, wait_seconds
from ratelimit.rules.tree import Rule, to_tree

P = ParamSpec("P")
R = TypeVar("R")
Decide = Callable[[CallKey, bool, bool, "float | None", Overriding], Awaitable[Decision]]
"""``decide(call, record, shadow, within, override)``: the decider's, or a penalizer's."""
penalty_logger = logging.getLogger("ratelimit.penalties")


class Limit:
    """Rules bound to a :class:`RateLimit`: a decorator, an ``async with`` block, or
    :meth:`decide` for a decision without an exception.

    As a decorator of a coroutine function, a refused call raises
    :class:`RateLimitExceeded` and the function body does not run (a plain ``def`` is
    refused: :mod:`ratelimit.sync` limits those). ``async with`` raises on entry in the same
    way. Without ``key=``, a decorator counts under the function's ``module.qualname``, and
    blocks and methods under ``site``: where the limit was made
    (``module.qualname:line:column``, :func:`~ratelimit.front.wrapping.block_key`).
    """

    def __init__(
        self,
        decider: Decider,
        registry: Registry,
        rules: RulesLike | None,
        key: str | None,
        selector: object | None,
        selectors: dict[str, object],
        cost: CostLike = 1,
        wait: float | bool = False,
        shadow: bool = False,
        settle: Callable[[Any], CostValue | Awaitable[CostValue]] | None = None,
        site: str = "",
        penalty: object = None,
        count_when: CountWhen | None = None,
        lease: float | None = None,
    ) -> None:
        self._site = site
        self._lease = lease if lease is None else check_lease(lease, "limit(lease=)")
        if count_when is not None:  # it refunds by a settle
            decider.check_settling(count_when, "count_when", "outcome")
        self._count_when = count_when
        self._entered: dict[asyncio.Task[Any] | None, list[Decision]] = {}
        """Under ``count_when``, the decisions of the ``async with`` blocks under way, by
        task (a block's ``__aexit__`` settles its own)."""
        self._cost = CallCost(cost, decider.algorithm)
        check_flag("shadow", shadow)
        if settle is not None:
            decider.check_settling(settle)
        self._settle = settle
        self._shadow = shadow
        self._wait = wait_seconds(wait)
        if rules is None and key is None:
            raise TypeError("limit() needs rules, or key= naming rules registered elsewhere")
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be text, not {type(key).__name__}")
        self._decider = decider
        self._registry = registry
        self._key = key
        self._sources = SelectorSources(selectors, selector)
        self._compiled: CompiledTree | ChosenRules | None = None
        if isinstance(rules, Mapping) or (callable(rules) and not isinstance(rules, str)):
            self._compiled = ChosenRules(rules, selectors)
        elif rules is not None:
            self._compiled = compile_tree(to_tree(rules))
            where = f"limit('{self._compiled.tree}')"
            check_selector_keywords(self._compiled.selectors, selectors, where, LIMIT_OWN)
        if self._compiled is not None:
            self._check_cost(self._compiled)
        # Without rules, the registration of ``key`` is looked up at the first call.
        self._registration = (
            None if self._compiled is None else Registration(self._compiled, self._sources)
        )
        if self._compiled is not None and key:
            registry.register(key, self._compiled, self._sources)
        if lease is not None:  # where its blocks count (a decorator: its function's name)
            decider.lease_for(self._own_key(), lease)
        self._penalizer = penalizer_for(
            decider, penalty, self._compiled, f"key {key!r}" if key else site
        )
        self._decide: Decide = decider.decide
        """How a call is decided without a penalty; with one, :meth:`_call` gives the
        penalizer's ``decide`` with the value the penalty holds back for that call."""
        self._unheld = False  # warned once that the penalty's selector has no source

    def _registered(self, key: str) -> Registration:
        """Rules and selector sources of this limit, or of ``key`` when it has no rules."""
        if self._registration is None:
            registered = self._registry.registered(key)
            self._check_cost(registered.compiled)
            self._registration = Registration(
                registered.compiled, self._sources.merged_over(registered.sources)
            )
        return self._registration

    def _check_cost(self, rules: CompiledTree | ChosenRules) -> None:
        """The cost fits these rules (each tree of a mapping; a callable's trees at their
        first call)."""
        trees = rules.trees if isinstance(rules, ChosenRules) else (rules,)
        for compiled in trees:
            self._cost.check(compiled, self._decider.algorithm)

    async def _call(
        self,
        key: str,
        call: CallSite | None,
        cost: CostValue | None = None,
        answered: object = UNANSWERED,
        chosen: object = UNRESOLVED,
    ) -> tuple[CallKey, Overriding, Decide]:
        """What identifies one call under ``key``: its rules (an override's when one is in
        force: then ``True`` comes with it, or the rule of it that can never admit the
        call's cost), selector values and cost (``cost``, given for this call; else the
        limit's, of the call's arguments: ``answered``, what its callable answered for them
        when it was called already); and how to decide it: the decider's ``decide``,
        or under ``penalty=`` the penalizer's, with the value of the penalty's selector for
        the limit's own rules (:meth:`_held`)."""
        registration = self._registered(key)
        rules = registration.compiled
        by = None
        if type(rules) is CompiledTree:
            compiled = rules
        else:
            compiled, by = await rules.choose(registration.sources, key, call, chosen)  # type: ignore[union-attr]
        values: tuple[str | None, ...] = ()
        if compiled.selectors:
            now = resolved_now(compiled.selectors, registration.sources, call)
            values = (
                now
                if now is not None
                else await resolve(compiled.selectors, registration.sources, key, call)
            )
        decider = self._decider
        decide, penalizer = self._decide, self._penalizer
        if penalizer is not None:
            held = None if penalizer.selector is None else penalizer.value_in(compiled, values)
            if held is NOT_NAMED:  # the rules chosen for this call do not name it
                held = await self._held(key, call, compiled)
            decide = functools.partial(penalizer.decide, value=held)
        overrides = decider.overrides
        if overrides is not None:
            if overrides.stale():
                await overrides.current()
            if overrides.has(key):  # then most calls still match none: no await for them
                named = dict(zip(compiled.selectors, values, strict=True))  # no name#n here
                if by is not None:
                    named.setdefault(*by)
                found = overrides.match(key, named)
                if found is not None:
                    given: Any = cost if answered is UNANSWERED else answered
                    overridden = await self._overridden(
                        overrides, found, key, call, given, named, compiled
                    )
                    if overridden is not None:
                        return (*overridden, decide)
        if cost is None and self._cost.fixed:  # most calls: no coroutine for the cost
            return (
                self._call_key(key, compiled, values, self._cost.of(compiled, decider.algorithm)),
                False,
                decide,
            )
        return (*await self._own_counted(key, call, cost, compiled, values, answered), decide)

    async def _held(self, key: str, call: CallSite | None, compiled: CompiledTree) -> Found:
        """The value the penalty holds back for a call whose rules (``compiled``, chosen for
        it) do not name its selector: resolved from the limit's sources by name; ``None``
        when no source gives it (the call is then not held, and its refusal counts
        nowhere). Otherwise :meth:`_call` reads it among the values of the call's rules."""
        penalizer = self._penalizer
        assert penalizer is not None
        assert penalizer.selector is not None
        try:
            (value,) = await resolve(
                (penalizer.selector,), self._registered(key).sources, key, call
            )
        except SelectorNotFoundError as exc:
            if not self._unheld:  # a misspelt selector would otherwise never hold anyone
                self._unheld = True
                penalty_logger.warning(
                    "ratelimit: penalty '%s' of key %r holds back %r, which neither the "
                    "rules chosen for a call (%s) nor the limit's sources give: such calls "
                    "are not held, and their refusals count nowhere (%s)",
                    penalizer.penalty,
                    key,
                    penalizer.selector,
                    compiled.tree,
                    exc,
                )
            return None
        return value

    def _call_key(
        self, key: str, compiled: CompiledTree, values: tuple[str | None, ...], counted: Cost
    ) -> CallKey:
        decider = self._decider
        return new_call_key(  # CallKey(...) built in C: this is every call's path
            CallKey, (compiled, decider.namespace, key, values, counted, decider.algorithm)
        )

    async def _counted(
        self,
        key: str,
        call: CallSite | None,
        cost: CostValue | None,
        compiled: CompiledTree,
        values: tuple[str | None, ...],
        bounded: bool = True,
    ) -> CallKey:
        if cost is None and self._cost.fixed and bounded:
            counted = self._cost.of(compiled, self._decider.algorithm)
        else:
            counted = await self._cost_of(call, cost, compiled, self._decider.algorithm, bounded)
        return self._call_key(key, compiled, values, counted)

    async def _own_counted(
        self,
        key: str,
        call: CallSite | None,
        cost: CostValue | None,
        compiled: CompiledTree,
        values: tuple[str | None, ...],
        answered: object = UNANSWERED,
    ) -> tuple[CallKey, Overriding]:
        """A call under the limit's own rules at a cost of its own (``cost``, given for this
        call, else the callable's answer: ``answered``, when it was called already), and
        ``False``; or, when its rules can never admit
        that cost, the :class:`~ratelimit.overrides.lowered.Never` that refuses it (a
        caller's cost is a refusal, not an error: ``max_tokens=5000`` under ``1000 tokens/m``)."""
        algorithm = self._decider.algorithm
        if cost is not None:
            value: object = cost
            what = "cost"
        elif answered is not UNANSWERED:
            value, what = answered, self._cost.what
        else:
            args, kwargs = ((), None) if call is None else (call.args, call.kwargs)
            value, what = await self._cost.answer(args, kwargs), self._cost.what
        try:
            counted = per_leaf(compiled, value, algorithm, what)
        except ConfigurationError:
            found = never(compiled, self._decider.namespace, key, values, value, algorithm)  # type: ignore[arg-type]
            if found is None:
                raise
            return self._call_key(key, compiled, values, found[0]), found[1]
        return self._call_key(key, compiled, values, counted), False

    async def _cost_of(
        self,
        call: CallSite | None,
        cost: CostValue | None,
        compiled: CompiledTree,
        algorithm: Algorithm,
        bounded: bool = True,
    ) -> Cost:
        """The cost of one call: ``cost``, given for this call; else the limit's callable's
        answer for the call's arguments."""
        if cost is not None:
            return per_leaf(compiled, cost, algorithm, "cost", bounded=bounded)
        if call is None:
            return await self._cost.call(compiled, algorithm, bounded=bounded)
        return await self._cost.call(compiled, algorithm, call.args, call.kwargs, bounded)

    async def _overridden(
        self,
        overrides: OverrideCache,
        found: Override,
        key: str,
        call: CallSite | None,
        cost: CostValue | None,
        named: dict[str, str | None],
        limit: CompiledTree,
    ) -> tuple[CallKey, Overriding] | None:
        """The call under ``found``, the override in force for its values (``named``), and
        ``True``; ``None`` for the limit's own rules when it cannot apply to the call (a
        selector it names that this limit cannot resolve, a cost its rules cannot count:
        logged). A cost above what its rules admit at once comes with the rule that
        refuses it (:mod:`ratelimit.overrides.lowered`)."""
        try:
            tree = found.compiled
            missing = [s for s in tree.selectors if s not in named]
            if missing:
                more = await resolve(missing, self._registered(key).sources, key, call)
                named.update(zip(missing, more, strict=True))
            own = tuple(named[s] for s in tree.selectors)
            if cost is None and self._cost.fixed:  # the fixed cost, checked once per tree
                try:
                    return await self._counted(key, call, cost, tree, own), True
                except ConfigurationError:  # perhaps a limit lowered below the call's cost
                    counted = await self._counted(key, call, cost, tree, own, bounded=False)
                    return counted, refusing(*counted)
            # a cost of this call's own: worked out once (a callable is called once)
            counted = await self._counted(key, call, cost, tree, own, bounded=False)
            try:
                check_cost(tree, counted.cost, self._decider.algorithm)
            except ConfigurationError:
                return counted, refusing(*counted)
            return counted, True
        except (ConfigurationError, SelectorNotFoundError) as exc:
            overrides.warn(
                (key, found.values),
                f"override {found} not applied; key {key!r} keeps its own rules: {exc}",
            )
            return None

    async def _admit(
        self,
        key: str,
        site: CallSite,
        shadow: bool | None = None,
        answered: object = UNANSWERED,
        chosen: object = UNRESOLVED,
    ) -> Decision:
        """Admit one call of the decorated function under ``key`` (waiting up to ``wait=``),
        or raise ``RateLimitExceeded``: what the decorator does before the body runs.
        ``answered``: what the limit's cost callable answered for it, when it was called
        already (:data:`UNANSWERED`: not yet); ``chosen``: the value of the selector its rules
        mapping is keyed by, when it was resolved already (:class:`Chooser`)."""
        if shadow is None:
            shadow = self._shadow
        call, override, decide = await self._call(key, site, answered=answered, chosen=chosen)
        if self._wait and not isinstance(override, Rule | Never):  # lowered: waiting never helps
            decision = await admitted(
                lambda: decide(call, True, shadow, None, override), self._wait
            )
        else:
            decision = await decide(call, True, shadow, None, override)
            if not decision.allowed and not decision.shadow:
                raise RateLimitExceeded(decision)
        return decision

    async def _settled(self, decision: Decision, result: Any, raised: bool = False) -> None:
        """What the decorator does once the body ended with ``result`` (the exception it
        raised, when ``raised``): a call ``count_when`` does not count is refunded; else
        one that returned is settled by ``settle=`` of its result."""
        count_when = self._count_when
        if count_when is not None:
            counts = count_when(result)
            if inspect.isawaitable(counts):
                counts = await counts
            if not counts:
                await self._decider.settle(decision, 0)
                return
        if raised or self._settle is None:
            return
        actual = self._settle(result)
        if actual.__class__ is not int and inspect.isawaitable(actual):  # most are numbers
            actual = await actual
        await self._decider.settle(decision, actual)

    def _own_key(self) -> str:
        return self._site if self._key is None else self._key

    async def peek(self, *, cost: CostValue | None = None) -> Decision:
        """The decision ``decide()`` would give, recording nothing. ``cost``: as for
        :meth:`decide`."""
        call, override, decide = await self._call(self._own_key(), None, cost)
        return await decide(call, False, self._shadow, None, override)

    async def reset(self) -> None:
        """Forget the hits of this limit's identifiers (with ``limit()``'s selectors)."""
        await self._decider.reset((await self._call(self._own_key(), None, 1))[0])

    async def decide(self, *, cost: CostValue | None = None) -> Decision:
        """Decide one call under this limit's key without raising: the hit is recorded only
        if ``Decision.allowed``. Selectors come from ``limit()``'s arguments. ``cost``:
        what this call counts (a number, or a mapping from units to amounts); default the
        limit's ``cost=`` (a callable of it is called with no arguments)."""
        call, override, decide = await self._call(self._own_key(), None, cost)
        return await decide(call, True, self._shadow, None, override)

    async def acquire(
        self, wait: float | bool | None = None, *, cost: CostValue | None = None
    ) -> Decision:
        """Be admitted, waiting up to ``wait`` seconds (default: the limit's ``wait=``), or
        raise ``RateLimitExceeded``. What ``async with`` does on entry. ``cost``: as for
        :meth:`decide`."""
        seconds = self._wait if wait is None else wait_seconds(wait)
        call, override, decide = await self._call(self._own_key(), None, cost)
        if isinstance(override, Rule | Never):  # lowered below the cost: waiting never helps
            seconds = 0.0
        return await admitted(lambda: decide(call, True, self._shadow, None, override), seconds)

    async def settle(self, decision: Decision, actual: CostValue) -> bool:
        """Record what the call ``decision`` admitted really cost: ``actual`` (a number, or
        a mapping from units to amounts) replaces the cost it reserved, on every identifier
        it counted on, in one atomic step: a surplus is refunded, an excess recorded past
        the limit (see :mod:`ratelimit.core.settling`). ``True`` once recorded; ``False`` for a
        decision that recorded nothing (refused, degraded: a no-op) or when the storage
        failed (logged; raised under ``on_error="raise"``). Settling twice, a peek or a
        call admitted by ``background`` counting raises ``SettleError``.

        Example::

            decision = await limit.acquire(cost={"tokens": 4000})
            reply = await model.complete(prompt, max_tokens=4000)
            await limit.settle(decision, {"tokens": reply.usage.total_tokens})
        """
        return await self._decider.settle(decision, actual)

    def __enter__(self) -> NoReturn:
        """``with rl.limit(...)``: an async limit is entered with ``async with``."""
        raise TypeError(
            "rl.limit(...) is entered with 'async with' (it decides without blocking the "
            "event loop); in threaded code, use ratelimit.sync.RateLimit, whose limits are "
            "entered with 'with'"
        )

    def __exit__(self, *exc_info: object) -> None:  # never reached: __enter__ raises
        return None

    async def __aenter__(self) -> Decision:
        decision = await self.acquire()
        if self._count_when is not None:
            self._entered.setdefault(asyncio.current_task(), []).append(decision)
        return decision

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._count_when is None:
            return None
        task = asyncio.current_task()
        entered = self._entered.get(task)
        if not entered:  # entered in another task: its decision is not this one's to settle
            return None
        decision = entered.pop()
        if not entered:
            del self._entered[task]
        if exc is None or isinstance(exc, Exception):  # cancelled: the reservation stays
            await self._settled(decision, exc, raised=True)
        return None

    def _bind(self, func: Callable[..., Any]) -> tuple[str, Parameters]:
        """The key and parameters of a function this limit decorates (registered under the
        function's name when it has no ``key=``)."""
        parameters = wrappable(
            func,
            "limit",
            "the limit would count the call, not the iteration; limit the code that consumes "
            "it instead",
        )
        key = self._key if self._key is not None else function_name(func)
        if self._compiled is not None:  # a name that no call can supply fails here
            findable(self._compiled, self._sources, parameters, func, key)
        if self._compiled is not None and self._key is None:
            self._registry.register(key, self._compiled, self._sources)
        if self._lease is not None and self._key is None:
            self._decider.lease_for(key, self._lease)
        return key, parameters

    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[object, None, R]]:
        return decorate(self, func)  # ratelimit.front.decorator

    def _direct(self, key: str, parameters: Parameters) -> DirectPaths:
        """The direct path of this limit on a function of ``parameters`` (a tree of its own;
        a fixed cost, or a callable's per call), the store's admission without a coroutine,
        and the fused path (:func:`~ratelimit.front.fused.direct_paths`; a penalty's holds
        read there as ``Penalizer.free``; none under ``settle=`` or ``count_when=``)."""
        compiled, decider, penalizer = self._compiled, self._decider, self._penalizer
        if type(compiled) is not CompiledTree:
            return None, None, None
        if penalizer is not None and (not penalizer.direct or self._wait):
            return None, None, None  # a hold read with a coroutine; refusals waited out
        cost = self._cost.of(compiled, decider.algorithm) if self._cost.fixed else None
        free = None if penalizer is None else penalizer.free(compiled, key)
        paths = direct_paths(decider, compiled, key, self._sources, parameters, cost, free)
        fused = not (self._settle or self._count_when or (penalizer is not None and free is None))
        return paths if fused else (paths[0], paths[1], None)  # whole decisions; a hold read

    def _chooser(self, key: str, parameters: Parameters) -> Chooser | None:
        """The paths of each rules entry of a mapping keyed by a keyword selector
        (:class:`~ratelimit.front.chosen.Chooser`), when every entry has a direct path;
        ``None`` for any other limit (a penalty, a cost callable: the general path)."""
        rules, decider = self._compiled, self._decider
        if type(rules) is not ChosenRules or rules.function is not None:
            return None
        if self._penalizer is not None or not self._cost.fixed:
            return None
        paths = {}
        for value, compiled in rules.entries.items():
            cost = self._cost.of(compiled, decider.algorithm)
            direct, admit, fused = direct_paths(
                decider, compiled, key, self._sources, parameters, cost
            )
            if direct is None:
                return None
            if self._settle or self._count_when:
                fused = None
            paths[value] = (direct, admit, fused)
        return Chooser(self._sources.keywords[rules.by], paths)

    async def _penalized(
        self,
        known: Direct,
        refusal: Decision,
        shadow: bool,
        target: Any,
        cost: Cost | None,
        started: float = 0.0,
    ) -> Decision:
        """A refusal of the rules the direct path decided for a penalized limit's call (its
        ``target``: :meth:`Penalizer.unheld`; no ``wait=``), as ``Penalizer.decide``
        answers it (told, remembered, noted: held back if it starts a hold); raised unless
        let through in shadow. A held call (``Penalizer.asking``) is told as it is."""
        assert self._penalizer is not None
        decision: Decision = refusal
        if refusal.__class__ is HeldDecision:  # not a refusal of the rules: no more
            self._decider.tell(refusal, started)
        else:
            _, told = self._refusal(known, refusal, shadow, started, cost, raising=False)
            decision = await self._penalizer.noted(target, told)
        if not decision.shadow:
            raise RateLimitExceeded(decision)
        return decision

    async def _waited(self, call: CallKey, refusal: Decision) -> Decision:
        """Wait out a refusal of the direct path under ``wait=`` (:meth:`_refusal`)."""
        decider = self._decider
        return await admitted(lambda: decider.decide(call, True), self._wait, first=refusal)

    def _refusal(
        self,
        known: Direct,
        decision: Decision,
        shadow: bool,
        started: float | None = None,
        cost: Cost | None = None,
        raising: bool = True,
    ) -> tuple[CallKey, Decision]:
        """A refusal the store gave the direct path to a call (``known``: its plan and
        selector values):
        remembered, told to the hooks when ``started`` is given (whole decisions: the
        decision took since then, when they are timed); the call's key and the refusal,
        marked ``shadow`` when let through, to wait out (:meth:`_waited`) under ``wait=``;
        else ``RateLimitExceeded`` (unless not ``raising``: a penalized limit's, noted
        first)."""
        decider, key = self._decider, decision.key
        plan, values = known
        compiled = plan.compiled  # the limit's tree, or the one chosen for the call
        if cost is None:  # the limit's fixed cost; else what its callable answered
            cost = self._cost.of(compiled, decider.algorithm)
        call = self._call_key(key, compiled, values, cost)
        decision = decider.refused(call, decision, shadow, started)
        if raising and not decision.shadow and not self._wait:
            raise RateLimitExceeded(decision)
        return call, decision
