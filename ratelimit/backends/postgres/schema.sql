-- The Postgres strategy's table and functions, put in place by schema.py at first use (or
-- ahead, by `ratelimit migrate` or `await rl.setup()`); every statement can run again safely.
--
-- ratelimit_counters holds the window counters of the sliding and fixed windows: per key
-- (an identifier, named as on Redis: rl:{<namespace>:<key>}[:<selector>=<value>]), window
-- size and window index, the count, and when the row may go (microseconds, the
-- database's clock). Window i of size S spans [i*S, (i+1)*S). A row of size 0 is a reset
-- mark (ratelimit_reset): its index is when the key was reset.
--
-- Every function takes p_now (microseconds) or NULL for the database's clock_timestamp(),
-- and locks the keys it touches with transaction-scoped advisory locks taken in key order,
-- so that two decisions on one key never interleave and never deadlock.

CREATE TABLE IF NOT EXISTS ratelimit_counters (
    key text NOT NULL,
    size_us bigint NOT NULL,
    idx bigint NOT NULL,
    count double precision NOT NULL,
    expires_us bigint NOT NULL,
    PRIMARY KEY (key, size_us, idx)
);

CREATE INDEX IF NOT EXISTS ratelimit_counters_expires ON ratelimit_counters (expires_us);

-- Lock p_keys (deduplicated, in order) until the transaction ends.
CREATE OR REPLACE FUNCTION ratelimit_lock(p_keys text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(k, 7419))
    FROM (SELECT DISTINCT unnest(p_keys) AS k ORDER BY 1) AS keys;
$$;

-- Hold p_count as window p_idx of size p_size on p_key, kept until p_expires (us).
CREATE OR REPLACE FUNCTION ratelimit_hold(
    p_key text, p_size bigint, p_idx bigint, p_count double precision, p_expires bigint
) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO ratelimit_counters AS c (key, size_us, idx, count, expires_us)
    VALUES (p_key, p_size, p_idx, p_count, p_expires)
    ON CONFLICT (key, size_us, idx) DO UPDATE
    SET count = excluded.count, expires_us = excluded.expires_us;
$$;

CREATE OR REPLACE FUNCTION ratelimit_now(p_now bigint) RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
$$;

-- Decide a whole rule tree on window counters and record the call, atomically; the same
-- work as window_counters.lua on Redis.
--
-- p_keys     per identifier its key; p_slots per leaf the index (from 1) of its key, or 0
--            when its selector did not resolve (never limited, records nothing).
-- p_counts, p_sizes   per leaf its count and window size in microseconds.
-- p_program  the tree as a prefix program of (opcode, operand) pairs: 0 = leaf (operand:
--            leaf index from 0), 1 = And, 2 = Or (operand: number of children).
-- p_costs    per key, what the call counts on it; p_record false only decides (peek);
--            p_sliding false: the fixed window.
--
-- Returns {allowed (1/0), now, current_1, previous_1, ..., current_L, previous_L}: now is
-- the time decided at (the start of the newest window held, when the clock went back
-- before it), per leaf the counts of its current and previous window before this call.
CREATE OR REPLACE FUNCTION ratelimit_decide(
    p_keys text[], p_slots int[], p_counts bigint[], p_sizes bigint[], p_program int[],
    p_costs double precision[], p_record boolean, p_sliding boolean, p_now bigint
) RETURNS double precision[]
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := ratelimit_now(p_now);
    leaves int := coalesce(array_length(p_slots, 1), 0);
    result double precision[];
    limited boolean[] := '{}';
    currents double precision[] := '{}';
    win bigint;
    cur double precision;
    prev double precision;
    rate double precision;
    stack boolean[] := '{}';
    pos int;
    op int;
    n int;
    all_of boolean;
    any_of boolean;
    written text[] := '{}';
    pair text;
    held_a bigint[] := '{}';
    held_b bigint[] := '{}';
    count_a double precision[] := '{}';
    count_b double precision[] := '{}';
    row record;
BEGIN
    PERFORM ratelimit_lock(p_keys);
    -- per leaf, the two newest windows held (one read each); a window newer than now means
    -- the clock stepped back: decide at that window's start
    FOR i IN 1..leaves LOOP
        held_a := held_a || NULL::bigint;
        count_a := count_a || 0::double precision;
        held_b := held_b || NULL::bigint;
        count_b := count_b || 0::double precision;
        IF p_slots[i] > 0 THEN
            n := 0;
            FOR row IN
                SELECT c.idx, c.count FROM ratelimit_counters c
                WHERE c.key = p_keys[p_slots[i]] AND c.size_us = p_sizes[i]
                ORDER BY c.idx DESC LIMIT 2
            LOOP
                n := n + 1;
                IF n = 1 THEN
                    held_a[i] := row.idx;
                    count_a[i] := row.count;
                ELSE
                    held_b[i] := row.idx;
                    count_b[i] := row.count;
                END IF;
            END LOOP;
            IF held_a[i] IS NOT NULL AND held_a[i] * p_sizes[i] > now_us THEN
                now_us := held_a[i] * p_sizes[i];
            END IF;
        END IF;
    END LOOP;
    result := ARRAY[0, now_us]::double precision[];
    FOR i IN 1..leaves LOOP
        cur := 0;
        prev := 0;
        IF p_slots[i] > 0 THEN
            win := now_us / p_sizes[i];
            IF held_a[i] = win THEN cur := count_a[i]; END IF;
            IF held_b[i] = win THEN cur := count_b[i]; END IF;
            IF held_a[i] = win - 1 THEN prev := count_a[i]; END IF;
            IF held_b[i] = win - 1 THEN prev := count_b[i]; END IF;
            rate := cur;
            IF p_sliding THEN
                rate := cur + prev * (p_sizes[i] - (now_us - win * p_sizes[i]))::double precision
                    / p_sizes[i]::double precision;
            END IF;
            limited := limited || (rate + p_costs[p_slots[i]] > p_counts[i]::double precision);
        ELSE
            limited := limited || false;
        END IF;
        currents := currents || cur;
        result := result || cur || prev;
    END LOOP;
    -- the prefix program, read right to left: each operator finds its children on the stack
    pos := coalesce(array_length(p_program, 1), 0) - 1;
    WHILE pos >= 1 LOOP
        op := p_program[pos];
        n := p_program[pos + 1];
        IF op = 0 THEN
            stack := stack || limited[n + 1];
        ELSE
            all_of := true;
            any_of := false;
            FOR j IN array_length(stack, 1) - n + 1 .. array_length(stack, 1) LOOP
                all_of := all_of AND stack[j];
                any_of := any_of OR stack[j];
            END LOOP;
            stack := stack[1:array_length(stack, 1) - n];
            IF op = 1 THEN stack := stack || all_of; ELSE stack := stack || any_of; END IF;
        END IF;
        pos := pos - 2;
    END LOOP;
    IF stack[1] THEN
        RETURN result;
    END IF;
    result[1] := 1;
    IF NOT p_record THEN
        RETURN result;
    END IF;
    FOR i IN 1..leaves LOOP
        IF p_slots[i] > 0 THEN
            pair := p_keys[p_slots[i]] || ' ' || p_sizes[i];
            IF NOT pair = ANY(written) THEN
                written := written || pair;
                PERFORM ratelimit_hold(p_keys[p_slots[i]], p_sizes[i], now_us / p_sizes[i],
                                       currents[i] + p_costs[p_slots[i]],
                                       now_us + 2 * p_sizes[i]);
            END IF;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;

-- Kong's counter API: add p_value to the current window of p_size on p_key and return the
-- rate after it (p_weight: the previous window's weight, NULL for (S - elapsed) / S).
CREATE OR REPLACE FUNCTION ratelimit_update(
    p_key text, p_size bigint, p_value double precision, p_weight double precision, p_now bigint
) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := ratelimit_now(p_now);
    newest bigint;
    win bigint;
    cur double precision;
    prev double precision;
BEGIN
    PERFORM ratelimit_lock(ARRAY[p_key]);
    SELECT max(c.idx) INTO newest FROM ratelimit_counters c
    WHERE c.key = p_key AND c.size_us = p_size;
    IF newest IS NOT NULL AND newest * p_size > now_us THEN now_us := newest * p_size; END IF;
    win := now_us / p_size;
    SELECT c.count INTO cur FROM ratelimit_counters c
    WHERE c.key = p_key AND c.size_us = p_size AND c.idx = win;
    SELECT c.count INTO prev FROM ratelimit_counters c
    WHERE c.key = p_key AND c.size_us = p_size AND c.idx = win - 1;
    cur := coalesce(cur, 0) + p_value;
    prev := coalesce(prev, 0);
    IF p_value <> 0 THEN
        PERFORM ratelimit_hold(p_key, p_size, win, cur, now_us + 2 * p_size);
    END IF;
    IF p_weight IS NULL THEN
        RETURN cur + prev * (p_size - (now_us - win * p_size))::double precision
            / p_size::double precision;
    END IF;
    RETURN cur + prev * p_weight;
END;
$$;

-- sync_rate > 0 (Kong's local counters): push many identifiers' local diffs and fetch their
-- totals in one round trip. Entry i adds p_diffs[i] to window p_idx[i] of size p_sizes[i]
-- on p_keys[i] (0 only asks). Returns {now, then per (key, size) in order of first entry:
-- i (that first entry), size, index_a, count_a, index_b, count_b}: the two newest windows
-- held (-1 and 0 for none).
CREATE OR REPLACE FUNCTION ratelimit_sync(
    p_keys text[], p_sizes bigint[], p_idx bigint[], p_diffs double precision[], p_now bigint
) RETURNS double precision[]
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := ratelimit_now(p_now);
    entries int := coalesce(array_length(p_keys, 1), 0);
    result double precision[];
    seen text[] := '{}';
    pair text;
    held record;
    got int;
BEGIN
    PERFORM ratelimit_lock(p_keys);
    FOR i IN 1..entries LOOP
        IF p_diffs[i] <> 0 THEN
            INSERT INTO ratelimit_counters AS c (key, size_us, idx, count, expires_us)
            VALUES (p_keys[i], p_sizes[i], p_idx[i], p_diffs[i], now_us + 2 * p_sizes[i])
            ON CONFLICT (key, size_us, idx) DO UPDATE
            SET count = c.count + excluded.count,
                expires_us = greatest(c.expires_us, excluded.expires_us);
        END IF;
    END LOOP;
    result := ARRAY[now_us]::double precision[];
    FOR i IN 1..entries LOOP
        pair := p_keys[i] || ' ' || p_sizes[i];
        IF NOT pair = ANY(seen) THEN
            seen := seen || pair;
            result := result || i::double precision || p_sizes[i]::double precision;
            got := 0;
            FOR held IN
                SELECT c.idx, c.count FROM ratelimit_counters c
                WHERE c.key = p_keys[i] AND c.size_us = p_sizes[i]
                ORDER BY c.idx DESC LIMIT 2
            LOOP
                result := result || held.idx::double precision || held.count;
                got := got + 1;
            END LOOP;
            WHILE got < 2 LOOP
                result := result || (-1)::double precision || (0)::double precision;
                got := got + 1;
            END LOOP;
        END IF;
    END LOOP;
    RETURN result;
END;
$$;

-- Settle a call after it ran, atomically (ratelimit/core/settling.py): entry i adds p_deltas[i]
-- on window size p_sizes[i] of p_keys[i]. A refund (below 0) takes back from the window the
-- reservation was counted in (p_at, us) while it is held, never below 0, and nothing when
-- the key was reset since (a reset mark, ratelimit_reset, at p_at or later); an excess (above
-- 0) is added to the current window (at the newest window's start when the clock stepped
-- back, as ratelimit_decide decides), past the limit. Returns now.
CREATE OR REPLACE FUNCTION ratelimit_settle(
    p_keys text[], p_sizes bigint[], p_deltas double precision[], p_at bigint, p_now bigint
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := ratelimit_now(p_now);
    entries int := coalesce(array_length(p_keys, 1), 0);
    newest bigint;
    cur double precision;
BEGIN
    PERFORM ratelimit_lock(p_keys);
    FOR i IN 1..entries LOOP
        SELECT max(c.idx) INTO newest FROM ratelimit_counters c
        WHERE c.key = p_keys[i] AND c.size_us = p_sizes[i];
        IF newest IS NOT NULL AND newest * p_sizes[i] > now_us THEN
            now_us := newest * p_sizes[i];
        END IF;
    END LOOP;
    FOR i IN 1..entries LOOP
        IF p_deltas[i] < 0 THEN
            UPDATE ratelimit_counters c SET count = greatest(c.count + p_deltas[i], 0)
            WHERE c.key = p_keys[i] AND c.size_us = p_sizes[i] AND c.idx = p_at / p_sizes[i]
              AND NOT EXISTS (
                  SELECT 1 FROM ratelimit_counters m
                  WHERE m.key = p_keys[i] AND m.size_us = 0 AND m.idx >= p_at
                    AND m.expires_us > now_us);
        ELSIF p_deltas[i] > 0 THEN
            SELECT c.count INTO cur FROM ratelimit_counters c
            WHERE c.key = p_keys[i] AND c.size_us = p_sizes[i]
              AND c.idx = now_us / p_sizes[i];
            PERFORM ratelimit_hold(p_keys[i], p_sizes[i], now_us / p_sizes[i],
                                   coalesce(cur, 0) + p_deltas[i], now_us + 2 * p_sizes[i]);
        END IF;
    END LOOP;
    RETURN now_us;
END;
$$;

-- Forget what p_keys counted (reset()) and mark each key reset at now: a row of window size
-- 0 whose index is the time of the reset, so that a settle's refund of a call reserved
-- before it takes nothing counted after it (ratelimit_settle). The mark is kept p_keep us
-- at least, and as long as the longest row it forgot (whatever rules wrote it) or an
-- earlier mark would have been: a refund takes only from what is held. Returns now.
CREATE OR REPLACE FUNCTION ratelimit_reset(p_keys text[], p_keep bigint, p_now bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := ratelimit_now(p_now);
BEGIN
    PERFORM ratelimit_lock(p_keys);
    WITH gone AS (
        DELETE FROM ratelimit_counters WHERE key = ANY(p_keys)
        RETURNING key, expires_us
    )
    INSERT INTO ratelimit_counters (key, size_us, idx, count, expires_us)
    SELECT k, 0, now_us, 0,
           greatest(now_us + p_keep, (SELECT max(g.expires_us) FROM gone g WHERE g.key = k))
    FROM (SELECT DISTINCT unnest(p_keys) AS k) AS keys;
    RETURN now_us;
END;
$$;

-- Overrides (rl.overrides): per namespace, a table from an override's identity to its
-- record (with when it expires, seconds since the epoch, and the namespace's version its
-- write made: the store's order of overrides, NULL for one written before it was kept),
-- and a version every write bumps. Keys processes announced sit in the same table (ids
-- 'key:<key>', records empty).
CREATE TABLE IF NOT EXISTS ratelimit_overrides (
    namespace text NOT NULL,
    id text NOT NULL,
    record text NOT NULL,
    expires double precision,
    version bigint,
    PRIMARY KEY (namespace, id)
);
ALTER TABLE ratelimit_overrides ADD COLUMN IF NOT EXISTS version bigint;

CREATE TABLE IF NOT EXISTS ratelimit_override_versions (
    namespace text PRIMARY KEY,
    version bigint NOT NULL
);

-- Keep p_record under p_id (NULL: delete it) with the namespace's next version, whose
-- row lock orders the writers of one namespace. Returns whether p_id was there before.
CREATE OR REPLACE FUNCTION ratelimit_override_write(
    p_namespace text, p_id text, p_record text, p_expires double precision
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    existed boolean;
    made bigint;
BEGIN
    INSERT INTO ratelimit_override_versions AS v (namespace, version) VALUES (p_namespace, 1)
    ON CONFLICT (namespace) DO UPDATE SET version = v.version + 1
    RETURNING v.version INTO made;
    existed := EXISTS (
        SELECT 1 FROM ratelimit_overrides WHERE namespace = p_namespace AND id = p_id
    );
    IF p_record IS NULL THEN
        DELETE FROM ratelimit_overrides WHERE namespace = p_namespace AND id = p_id;
    ELSE
        INSERT INTO ratelimit_overrides (namespace, id, record, expires, version)
        VALUES (p_namespace, p_id, p_record, p_expires, made)
        ON CONFLICT (namespace, id) DO UPDATE
        SET record = excluded.record, expires = excluded.expires, version = excluded.version;
    END IF;
    RETURN existed;
END;
$$;

-- Delete the overrides of p_namespace expired at p_now; bump the version if any went.
-- Keys announced over 7 days ago (by the database's clock; records empty: announced before
-- they were dated) go too, without a version bump.
CREATE OR REPLACE FUNCTION ratelimit_override_prune(
    p_namespace text, p_now double precision
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    pruned integer;
BEGIN
    INSERT INTO ratelimit_override_versions AS v (namespace, version) VALUES (p_namespace, 0)
    ON CONFLICT (namespace) DO UPDATE SET version = v.version;
    DELETE FROM ratelimit_overrides WHERE namespace = p_namespace AND expires <= p_now;
    GET DIAGNOSTICS pruned = ROW_COUNT;
    DELETE FROM ratelimit_overrides
    WHERE namespace = p_namespace AND id LIKE 'key:%'
      AND CASE WHEN record ~ '^[0-9]+(\.[0-9]+)?$'
               THEN record::double precision <= extract(epoch FROM now()) - 604800
               ELSE true END;
    IF pruned > 0 THEN
        UPDATE ratelimit_override_versions SET version = version + 1
        WHERE namespace = p_namespace;
    END IF;
    RETURN pruned;
END;
$$;

-- Penalties (limit(..., penalty=...)): per identifier held back (namespace, key, selector
-- and value; '' for a whole key's), the times (us) of its recent refusals and the end of its
-- hold; a row may go once expires_us has passed (deleted when holds are listed or lifted).
CREATE TABLE IF NOT EXISTS ratelimit_penalties (
    namespace text NOT NULL,
    key text NOT NULL,
    selector text NOT NULL,
    value text NOT NULL,
    refusals bigint[] NOT NULL,
    held_until bigint NOT NULL,
    expires_us bigint NOT NULL,
    PRIMARY KEY (namespace, key, selector, value)
);
CREATE INDEX IF NOT EXISTS ratelimit_penalties_expires ON ratelimit_penalties (expires_us);

-- Note one refusal at p_now (NULL: the database's clock) of a penalty of p_count refusals
-- within p_span_us, holding for p_hold_us: the hold's end when this refusal started one,
-- else 0 (also while a hold is in force: it is never extended). The row is locked.
CREATE OR REPLACE FUNCTION ratelimit_note_refusal(
    p_namespace text, p_key text, p_selector text, p_value text, p_now bigint,
    p_span_us bigint, p_count integer, p_hold_us bigint
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := coalesce(p_now, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    kept bigint[];
    held bigint;
BEGIN
    -- DO UPDATE, not DO NOTHING: the row is locked from here, so that a sweep of rows past
    -- their time (which skips locked rows) never deletes it before it is read below
    INSERT INTO ratelimit_penalties AS p VALUES
        (p_namespace, p_key, p_selector, p_value, '{}', 0, now_us + p_span_us)
    ON CONFLICT (namespace, key, selector, value) DO UPDATE SET expires_us = p.expires_us;
    SELECT refusals, held_until INTO kept, held FROM ratelimit_penalties
    WHERE namespace = p_namespace AND key = p_key AND selector = p_selector AND value = p_value
    FOR UPDATE;
    IF held > now_us THEN
        RETURN 0;
    END IF;
    kept := array(SELECT t FROM unnest(kept) AS t WHERE t > now_us - p_span_us) || now_us;
    IF cardinality(kept) >= p_count THEN
        UPDATE ratelimit_penalties
        SET refusals = '{}', held_until = now_us + p_hold_us, expires_us = now_us + p_hold_us
        WHERE namespace = p_namespace AND key = p_key AND selector = p_selector
          AND value = p_value;
        RETURN now_us + p_hold_us;
    END IF;
    UPDATE ratelimit_penalties
    SET refusals = kept, expires_us = greatest(held_until, now_us + p_span_us)
    WHERE namespace = p_namespace AND key = p_key AND selector = p_selector AND value = p_value;
    RETURN 0;
END;
$$;
