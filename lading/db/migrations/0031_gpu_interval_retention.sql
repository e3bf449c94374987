-- The cleaner deletes closed GPU-time intervals (pool_gpu_intervals, migration 0026) after their
-- retention (`lading worker --retain-gpu-intervals-hours`), oldest first across pools: this index
-- lets each bounded DELETE find them without reading the table.
CREATE INDEX pool_gpu_intervals_starts_at ON pool_gpu_intervals (starts_at);
