//! The command's player of scenarios/vectors/bad_input.json: every case
//! the command can express exits 123 with `dlock: <code>: …`, the code the
//! vector names (the core's word), before anything connects. Cases the
//! command cannot express are skipped by the file itself ("skip": {"cli":
//! why}); every word of a case's `message_has` must be in the message.
//! Needs no lock service.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The vector's `seconds` as a flag's text: `-1s`, `0.5s`, `NaN`.
fn duration_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        n => format!("{}s", n.as_f64().expect("a number of seconds")),
    }
}

/// The command's arguments for one case, or `None` if it has no way to
/// express it.
fn args_of(case: &Value) -> Option<Vec<String>> {
    let s = |k: &str| case[k].as_str().map(str::to_string);
    let flag = |setting: &str| format!("--{}", setting.replace('_', "-"));
    let mut args = vec!["run".to_string()];
    let mut name = "bad-input".to_string();
    match case["input"].as_str()? {
        "setting" => args.push(format!(
            "{}={}",
            flag(&s("setting")?),
            duration_text(&case["seconds"])
        )),
        "acquire_timeout" => args.push(format!("--timeout={}", duration_text(&case["seconds"]))),
        "without_endpoints" => args.push(format!("{}={}", flag(&s("setting")?), s("value")?)),
        "unknown_option" => {
            args.push(flag(&s("setting")?));
            args.push("1".into());
        }
        "description" => {
            let d = match (s("value"), case["value_len"].as_u64()) {
                (Some(v), _) if !v.contains('\0') => v,
                (None, Some(len)) => "x".repeat(len as usize),
                _ => return None,
            };
            args.push(format!("--description={d}"));
        }
        "lock_name" => {
            name = match (s("name"), case["name_len"].as_u64()) {
                (Some(n), _) if !n.contains('\0') => n,
                (None, Some(len)) => "a".repeat(len as usize),
                _ => return None,
            }
        }
        "semaphore_limit" if case.get("first_limit").is_none() => {
            name = s("name")?;
            args.push(format!("--limit={}", case["limit"].as_u64()?));
        }
        _ => return None,
    }
    args.extend([name, "--".into(), "true".into()]);
    Some(args)
}

#[test]
fn every_bad_input_is_the_vectors_code() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/vectors/bad_input.json");
    let vector: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the vector"))
        .expect("the vector is JSON");
    let cases = vector["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let (mut played, mut skipped, mut failures) = (0, 0, Vec::new());
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let want = case["code"].as_str().expect("code");
        if let Some(why) = case["skip"]["cli"].as_str() {
            println!("skip {id}: {why}");
            skipped += 1;
            continue;
        }
        let Some(args) = args_of(case) else {
            failures.push(format!(
                "{id}: the command cannot play this case, yet the vector does not skip it"
            ));
            continue;
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
        cmd.args(&args);
        for (k, _) in std::env::vars() {
            if k.starts_with("DLOCK_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().expect("run dlock");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        played += 1;
        let prefix = format!("dlock: {want}: ");
        if out.status.code() != Some(123) || !stderr.starts_with(&prefix) {
            failures.push(format!(
                "{id}: dlock {} exited {:?} with {stderr:?}, expected 123 and `{prefix}…`",
                args.join(" ").chars().take(120).collect::<String>(),
                out.status.code()
            ));
        } else if let Some(missing) = case["message_has"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|w| !stderr.contains(w))
        {
            failures.push(format!("{id}: {missing:?} not in {stderr:?}"));
        } else {
            println!("ok {id}: {}", stderr.trim());
        }
    }
    println!("cli bad_input: {played} played, {skipped} skipped");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
