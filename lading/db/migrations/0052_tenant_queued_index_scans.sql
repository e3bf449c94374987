-- The readers of tenant_queued (migration 0025) walk only the index entries of live rows.
--
-- Every statement that changes a tenant's queue inserts a delta row, and one in 32 folds the
-- tenant's rows into one, deleting the others: the table's rows are nearly all short-lived. The
-- planner read a tenant's rows with a bitmap scan, which returns every index entry whose heap row
-- is dead as well (a bitmap scan never marks an entry dead), so each admission and each fold read
-- every delta since the table was last vacuumed: 2,200 entries for 46 live rows after 22,000
-- single documents (no autovacuum), and between two autovacuum runs of a busy pool tens of
-- thousands. A plain index scan marks the entries of dead rows (no snapshot can see them) as it
-- passes, later scans skip them, and the index removes them when a page fills, before it splits:
-- the index stays a few pages whatever the churn between vacuums.
--
-- Both readers therefore run with bitmap (and sequential) scans off: the admission context's
-- sums through lading_tenant_queued_sums, the fold's ctid scan by the function's settings.
CREATE FUNCTION lading_tenant_queued_sums(of_tenant text, OUT jobs bigint, OUT bytes bigint)
    LANGUAGE plpgsql STABLE SET enable_bitmapscan = off SET enable_seqscan = off AS $$
BEGIN
    SELECT coalesce(sum(q.jobs), 0)::bigint, coalesce(sum(q.bytes), 0)::bigint INTO jobs, bytes
      FROM tenant_queued q WHERE q.tenant = of_tenant;
END $$;

ALTER FUNCTION lading_tenant_queued_fold(text[]) SET enable_bitmapscan = off SET enable_seqscan = off;
