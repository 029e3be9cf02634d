//! `engram remote acl TENANT USER PASSWORD`: the Redis ACL rule that lets a user read and write
//! exactly one tenant's keys of the remote KV tier (`--kv-remote-tenant TENANT=URL`).

use anyhow::Result;

/// `engram remote` subcommands.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand, Debug)]
enum Which {
    /// Print the `ACL SETUSER` command for a user limited to one tenant's keys, and the
    /// `--kv-remote-tenant` flag that uses it.
    Acl {
        /// The tenant (as API keys name it: `--api-key KEY=TENANT`).
        tenant: String,
        /// The Redis user to create.
        user: String,
        /// Its password.
        password: String,
        /// Where the store listens (for the flag).
        #[arg(long, default_value = "127.0.0.1:6379")]
        host: String,
    },
}

/// Runs the subcommand.
pub fn run(a: Args) -> Result<()> {
    match a.which {
        Which::Acl { tenant, user, password, host } => {
            let pattern = engram_remote::tenant_key_pattern(&tenant);
            println!("ACL SETUSER {user} on >{password} resetkeys ~{pattern} -@all +@read +@write +@keyspace +@connection -@dangerous");
            println!("--kv-remote-tenant {tenant}=redis://{user}:{password}@{host}/");
        }
    }
    Ok(())
}
