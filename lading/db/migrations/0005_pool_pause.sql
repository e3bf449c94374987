-- A pool whose endpoint refuses our key or our account's quota is paused for a while, so its
-- jobs wait instead of burning their attempt budgets against an endpoint that cannot serve.
ALTER TABLE pools ADD COLUMN paused_until timestamptz;
ALTER TABLE pools ADD COLUMN paused_reason text;
