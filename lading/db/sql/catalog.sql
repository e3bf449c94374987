-- The database catalog: what schema is there (lading/db/catalog.py).

-- name: catalog_table_exists
SELECT to_regclass($1) IS NOT NULL;

-- name: catalog_table_sizes_report
-- Every table of the current schema: rows as the planner estimates them (pg_class.reltuples, kept
-- by autovacuum and ANALYZE: no scan; -1 before the first) and bytes on disk, indexes and TOAST
-- included. Largest first.
SELECT c.relname AS name, greatest(c.reltuples, 0)::bigint AS rows_estimate,
       pg_total_relation_size(c.oid)::bigint AS bytes
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
 ORDER BY bytes DESC, name;
