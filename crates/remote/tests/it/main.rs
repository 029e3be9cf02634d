//! The remote tier against a real `redis-server`: round trips, content addressing, bad values,
//! faults (down, killed, restarted empty, full, paused), tenants' ACL users, records.

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod restore_profile;
mod sessions;
mod tenants;
mod tls;
