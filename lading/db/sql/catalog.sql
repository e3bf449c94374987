-- The database catalog: what schema is there (lading/db/observed.py).

-- name: catalog_table_exists
SELECT to_regclass($1) IS NOT NULL;
