-- 0011: a chain run's writes in one call (PostgreSQL only; service/store/postgres.py RunTx).
-- A production run consumes its ticket, writes the ticket's outbox event, creates the task if
-- new, appends the step event and stages the run's audit record: all in this one call, which
-- commits on its own (one statement, one implicit transaction: all of it or none).
-- Each part is skipped when its key argument is NULL. The client predicted the event's seq from
-- the task it read; a concurrent append that took that seq first fails the call (CPS01) and
-- nothing is written. A ticket that no longer matches raises CPT01 and nothing is written.
-- Returns the staged record's id and the transaction's id.
CREATE FUNCTION cp_chain_run(
    p_now DOUBLE PRECISION, p_cid TEXT,
    p_ticket TEXT, p_nonce_hash TEXT, p_subject TEXT, p_env TEXT, p_action TEXT,
    p_resource_hash TEXT, p_command_hash TEXT,
    p_event_id TEXT, p_event_type TEXT, p_event_at DOUBLE PRECISION, p_event_data JSONB,
    p_event_due DOUBLE PRECISION, p_event_window DOUBLE PRECISION,
    p_task TEXT, p_task_by TEXT, p_task_at DOUBLE PRECISION,
    p_kind TEXT, p_actor TEXT, p_at DOUBLE PRECISION, p_data JSONB, p_seq BIGINT,
    p_staged_at DOUBLE PRECISION, p_entry TEXT,
    OUT staged BIGINT, OUT xact TEXT
) LANGUAGE plpgsql AS $$
DECLARE
    v_seq BIGINT;
BEGIN
    IF p_ticket IS NOT NULL THEN
        -- The same conditional UPDATE as service/store/sql/tickets.py: its row lock makes a
        -- concurrent redeemer wait, then re-check against the committed row (exactly once).
        UPDATE tickets SET state = 'consumed', consumed_at = p_now, consumed_correlation_id = p_cid
         WHERE id = p_ticket AND state = 'approved' AND expires_at > p_now
           AND nonce_hash = p_nonce_hash AND subject_id = p_subject AND env = p_env
           AND action = p_action AND resource_hash = p_resource_hash
           AND (command_hash IS NULL OR command_hash = p_command_hash);
        IF NOT FOUND THEN
            RAISE EXCEPTION 'ticket not redeemable' USING ERRCODE = 'CPT01';
        END IF;
    END IF;
    IF p_event_id IS NOT NULL THEN
        INSERT INTO outbox_events (id, type, ticket_id, env, at, data, state, attempts,
                                   next_attempt_at, window_start)
        VALUES (p_event_id, p_event_type, p_ticket, p_env, p_event_at, p_event_data, 'pending', 0,
                p_event_due, p_event_window);
    END IF;
    IF p_task IS NOT NULL THEN
        INSERT INTO tasks (id, state, progress, result, created_by, created_at, updated_at, last_seq)
        VALUES (p_task, 'pending', 0, NULL, p_task_by, p_task_at, p_task_at, 0)
        ON CONFLICT (id) DO NOTHING;
        IF p_kind IS NOT NULL THEN
            UPDATE tasks SET last_seq = last_seq + 1, updated_at = p_at
             WHERE id = p_task RETURNING last_seq INTO v_seq;
            IF v_seq IS DISTINCT FROM p_seq THEN
                RAISE EXCEPTION 'task event seq taken' USING ERRCODE = 'CPS01';
            END IF;
            INSERT INTO task_events (task_id, seq, kind, at, actor, data)
            VALUES (p_task, v_seq, p_kind, p_at, p_actor, p_data);
        END IF;
    END IF;
    IF p_entry IS NOT NULL THEN
        INSERT INTO audit_staged (staged_at, entry) VALUES (p_staged_at, p_entry)
        RETURNING id INTO staged;
    END IF;
    xact := pg_current_xact_id()::text;
END $$;
