-- The buckets a tenant's erasure deletes the tenant's objects in (services/context/tenant_space.py),
-- noted before its first session is erased: the session configs that name some of them go with the
-- sessions, and a rerun of an erasure that failed after that must still clean those buckets. Bucket
-- names only (no personal data); kept after the erasure, as its record is (a rerun cleans them again).
-- Not a read model: a rebuild keeps it.
CREATE TABLE IF NOT EXISTS tenant_erasure_buckets (
    tenant text NOT NULL,
    bucket text NOT NULL,
    PRIMARY KEY (tenant, bucket)
);
