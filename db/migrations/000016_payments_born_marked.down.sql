ALTER TABLE payments
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN ('created', 'charge_sent', 'succeeded', 'declined', 'failed')),
    ALTER COLUMN status SET DEFAULT 'created';

INSERT INTO state_transitions (machine, from_state, to_state) VALUES ('payment', 'created', 'charge_sent');
