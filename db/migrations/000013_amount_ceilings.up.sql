-- Values have ceilings (R7). The API refuses amounts above eight digits of
-- minor units (validation.MaxAmount, as processors cap a charge); these
-- constraints say the same in the database, for every writer.
--
-- An order's books cannot say more than it owes: what was paid and not
-- refunded, plus what was refunded, is at most the order's amount. A
-- payment counted twice (the double credit that guarded transitions
-- prevent) then fails the orders consumer's transaction loudly, and is
-- dead-lettered, instead of passing silently. With every amount capped,
-- no sum the service keeps can come near int64's range.
--
-- NOT VALID: rows written before this migration are not scanned (no long
-- lock on a large table) and keep their values; every row inserted or
-- updated from now on is checked. VALIDATE CONSTRAINT checks the old rows
-- when convenient.
ALTER TABLE orders
    ADD CONSTRAINT orders_amount_ceiling CHECK (amount <= 99999999) NOT VALID,
    ADD CONSTRAINT orders_books_within_amount CHECK (amount_paid + amount_refunded <= amount) NOT VALID;
ALTER TABLE payments
    ADD CONSTRAINT payments_amount_ceiling CHECK (amount <= 99999999) NOT VALID;
ALTER TABLE refunds
    ADD CONSTRAINT refunds_amount_ceiling CHECK (amount <= 99999999) NOT VALID;
