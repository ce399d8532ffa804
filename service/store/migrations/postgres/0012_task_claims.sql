-- Task claims: the executor whose first report (started, or progress on a pending task) moved the
-- task to running. Only that subject may report on the task afterwards (409 task_claimed).
-- Tasks already past pending are claimed by the actor of their first executor report.
ALTER TABLE tasks ADD COLUMN claimed_by TEXT;
UPDATE tasks SET claimed_by = (
    SELECT e.actor FROM task_events e
     WHERE e.task_id = tasks.id AND e.kind IN ('started', 'progress', 'succeeded', 'failed')
     ORDER BY e.seq LIMIT 1
) WHERE state <> 'pending';
