//! `dlock elect` bad input that needs no lock service: one line on stderr
//! and exit 2 (usage) or 123 (invalid).

mod usage;

use usage::one_line_error;

#[test]
fn elect_usage_errors_are_one_line() {
    one_line_error(&["elect", "leaders"], 2, "dlock elect NAME VALUE -- CMD");
    one_line_error(
        &["elect", "leaders", "v"],
        2,
        "dlock elect NAME VALUE -- CMD",
    );
    one_line_error(
        &["elect", "leaders", "--", "true"],
        2,
        "dlock elect NAME VALUE",
    );
    one_line_error(
        &["elect", "--observe", "leaders", "v"],
        2,
        "--observe takes the election's name only",
    );
    one_line_error(&["elect", "--json", "leaders"], 2, "--observe");
    one_line_error(
        &["elect", "leaders", "v", "--", "true"],
        123,
        "no lock service",
    );
}
