-- The model a turn was dispatched with (the model proxy holds the worker to it), and the
-- token usage the model proxy metered from the provider's stream: totals per turn, and the
-- running step's usage until `turn.step` writes it into that step's `model.completed`.
ALTER TABLE turns ADD COLUMN model text;
ALTER TABLE turns ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN step_usage jsonb;
