-- Email addresses are unique per tenant regardless of case (login matches case-insensitively).
CREATE UNIQUE INDEX users_tenant_email_lower ON users (tenant_id, lower(email));
