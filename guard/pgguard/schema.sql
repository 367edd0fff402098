-- Tables of github.com/tenure-io/tenure/guard/pgguard. Idempotent: safe to
-- run on every start. Created in the first schema of the search_path.

-- One row per fenced resource: the largest fencing token accepted so far.
-- A row only ever moves to a larger (or equal) token.
CREATE TABLE IF NOT EXISTS tenure_fence (
    resource_key text        PRIMARY KEY,
    fence_token  bigint      NOT NULL CHECK (fence_token > 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per applied operation: a retried operation id is recognised and
-- not applied twice. Rows are written in the same transaction as the
-- effect, so an operation is recorded if and only if its effect committed.
CREATE TABLE IF NOT EXISTS tenure_fence_ops (
    resource_key text        NOT NULL,
    operation_id text        NOT NULL,
    token        bigint      NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_key, operation_id)
);

-- ForgetOperations deletes by age.
CREATE INDEX IF NOT EXISTS tenure_fence_ops_applied_at ON tenure_fence_ops (applied_at);
