CREATE INDEX payments_charge_key_idx ON payments (charge_key);
