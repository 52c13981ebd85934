-- `replicas` (0012) says where each replica's internal listener is: worker calls are
-- forwarded there with the cluster secret. It holds no tenant data (no tenant_id, no RLS),
-- and only the owner role writes it (`Store::replica_announce`, on a connection that never
-- switches to `berth_app`), but 0003's grants let `berth_app` write it too: a tenant-scoped
-- transaction could have pointed another replica's worker calls elsewhere.
--
-- Tenant-scoped reads do need it: `Store::worker_route` and `Store::session_route` join it
-- under the tenant's role (`tenant_read_opt`), in the round trip that reads the worker's
-- presence. So `berth_app` keeps SELECT only.
REVOKE ALL ON replicas FROM berth_app;
GRANT SELECT ON replicas TO berth_app;
