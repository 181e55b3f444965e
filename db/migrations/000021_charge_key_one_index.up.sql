-- payments_charge_key_idx (000010) and the unique payments_charge_key_key
-- (000012) index the same column the same way, so every payment insert
-- maintained two identical B-trees. The unique one stays: it holds one
-- payment per derived key and serves each lookup by charge_key (a
-- processor webhook names the key) as well as the plain one did.
-- Safe under expand/contract (docs/forking.md, "Upgrades without
-- downtime"): no statement names an index, and the previous release's
-- lookups by charge_key plan on the unique index. DROP INDEX reads no
-- rows: it holds the table's lock for a catalog change only.
DROP INDEX payments_charge_key_idx;
