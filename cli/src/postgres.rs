//! `dlock postgres migrate` and `dlock postgres schema`: PostgreSQL's
//! `dlock` schema for a deploy step, or for a DBA when the application's
//! role may not create it (docs/postgres.md "The schema").

use std::io::Write;

use clap::{Args, Subcommand};

use crate::Conn;
use crate::exit::Fail;

#[derive(Subcommand, Debug)]
pub enum PostgresCmd {
    /// Create or upgrade the `dlock` schema at the URL (idempotent; safe beside running clients).
    Migrate(MigrateArgs),
    /// Print the schema's SQL, for `psql -f -` or review.
    Schema,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    conn: Conn,
}

pub fn main(cmd: PostgresCmd) -> Result<i32, Fail> {
    match cmd {
        PostgresCmd::Migrate(args) => {
            let version = dlock::migrate(args.conn.endpoints()?)?;
            println!("dlock schema version {version}");
            Ok(0)
        }
        PostgresCmd::Schema => {
            let mut out = std::io::stdout();
            // A closed stdout (`| head`) is not an error worth a status.
            let _ = out
                .write_all(dlock::SCHEMA_SQL.as_bytes())
                .and_then(|()| out.flush());
            Ok(0)
        }
    }
}
