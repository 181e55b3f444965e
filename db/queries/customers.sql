-- name: CustomerPut :one
-- Create or replace in one statement: the primary key decides, so two
-- concurrent PUTs of one id never create two rows. A PUT that changes
-- nothing (a retry) leaves updated_at alone. inserted is true when this
-- statement created the row (xmax is 0 on a freshly inserted tuple).
INSERT INTO customers (tenant_id, id, name, email)
VALUES (@tenant_id, @id, @name, @email)
ON CONFLICT (tenant_id, id) DO UPDATE
SET name = excluded.name,
    email = excluded.email,
    updated_at = CASE
        WHEN (customers.name, customers.email) IS DISTINCT FROM (excluded.name, excluded.email) THEN now()
        ELSE customers.updated_at
    END
RETURNING tenant_id, id, name, email, created_at, updated_at, (xmax = 0)::boolean AS inserted;

-- name: CustomerGet :one
SELECT * FROM customers WHERE tenant_id = @tenant_id AND id = @id;
