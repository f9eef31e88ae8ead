//! The nemesis on PostgreSQL (placeholder while it is written).
