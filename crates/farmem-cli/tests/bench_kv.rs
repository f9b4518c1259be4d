//! `farmem bench kv` end to end on a tiny footprint: every policy under every hint mode at one
//! local share serves its requests with every object verified, and the JSON holds every point.

use std::process::Command;

#[test]
fn bench_kv_runs_every_policy_and_mode_and_writes_json() {
    let json = std::env::temp_dir().join(format!("farmem-bench-kv-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_farmem"))
        .args([
            "bench",
            "kv",
            "--size",
            "16M",
            "--local",
            "40",
            "--policies",
            "fifo,second-chance,lru,priority",
            "--modes",
            "prio,hint,unhinted",
            "--requests",
            "2000",
            "--warmup",
            "1000",
            "--repeat",
            "1",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("priority+prio"), "{stdout}");
    let text = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let points = j["points"].as_array().expect("points");
    for policy in ["fifo", "second-chance", "lru", "priority"] {
        for mode in ["prio", "hint", "unhinted"] {
            let p = points
                .iter()
                .find(|p| p["policy"] == policy && p["mode"] == mode)
                .unwrap_or_else(|| panic!("no point for {policy} {mode}: {text}"));
            assert_eq!(p["local_pct"].as_f64(), Some(40.0), "{p}");
            assert!(p["requests_per_s"].as_f64().unwrap() > 0.0, "{p}");
            // Below 100% local the requests must have gone to far memory: pages fetched by
            // every mode, and page faults where nothing is hinted.
            assert!(
                p["pages_fetched_per_request"].as_f64().unwrap() > 0.0,
                "{p}"
            );
            if mode == "unhinted" {
                assert!(
                    p["unhinted_faults_per_request"].as_f64().unwrap() > 0.0,
                    "{p}"
                );
            } else {
                assert!(p["hint_misses_per_request"].as_f64().unwrap() > 0.0, "{p}");
            }
        }
    }
    assert_eq!(points.len(), 12, "{text}");
    let summary = j["summary"].as_array().expect("summary");
    assert_eq!(summary.len(), 1, "{text}");
    assert!(summary[0]["priority_prio_vs_fifo_hint"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_kv_rejects_bad_arguments() {
    for args in [
        &["bench", "kv", "--repeat", "0"][..],
        &["bench", "kv", "--local", "0"][..],
        &["bench", "kv", "--table-pct", "100"][..],
        &["bench", "kv", "--size", "64K"][..],
        &["bench", "kv", "--policies", "random"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_farmem"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
    }
}
