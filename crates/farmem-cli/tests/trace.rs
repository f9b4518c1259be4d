//! `farmem trace` on a C program with known fault sites (tests/programs/trace/): a fill loop
//! (zero fills), a sequential scan, a strided scan and random reads, in three files and four
//! functions, under a budget of 1 MiB for a 16 MiB buffer with the fault read-ahead off, so
//! that the number of faults of each loop follows from the program:
//!
//! * fill: 4096 first touches;
//! * seq, two passes: 4096 - 256 each (the last budget's worth of pages is still local);
//! * stride (every 4th page), two passes: 1024 - 64 each;
//! * random, 4096 reads: 4096 * (1 - 256/4096).
//!
//! The report must put at least 95% of the sampled faults on those four lines, each share
//! within 5 points of the truth, suggest read-ahead for the scan and not for the random
//! reads; with the scan hinted, its line must vanish; the flame graph must be well-formed XML
//! naming the hot functions, the JSON must parse, and a build without debug information
//! must still give a report (module + offset). Needs root (perf events) and `cc`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::{farmem_bin, temp_path};

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/trace")
}

/// The line of `marker` in one of the sources, as `file:line`.
fn marked_line(file: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(source_dir().join(file)).unwrap();
    let n = text
        .lines()
        .position(|l| l.contains(&format!("/* {marker} */")))
        .unwrap_or_else(|| panic!("{marker} not in {file}"));
    format!("{file}:{}", n + 1)
}

fn build(debug: bool) -> PathBuf {
    let exe = temp_path(if debug { "sites-g" } else { "sites-nodebug" });
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
    let mut cmd = Command::new("cc");
    cmd.args(["-O1", "-o"]).arg(&exe).arg("-I").arg(&include);
    if debug {
        cmd.arg("-g");
    } else {
        cmd.arg("-s");
    }
    for f in ["sites.c", "stride.c", "random.c"] {
        cmd.arg(source_dir().join(f));
    }
    let out = cmd.output().expect("running cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Run `farmem trace` on `exe` with `args`; returns the output directory and the JSON.
fn trace(exe: &Path, args: &[&str], label: &str) -> (PathBuf, Value) {
    let out = temp_path(label);
    let run = Command::new(farmem_bin())
        .args(["trace", "--local-mem", "1M", "--out"])
        .arg(&out)
        .arg("--")
        .arg(exe)
        .args(args)
        .env("FARMEM_FAULT_READAHEAD", "0")
        .output()
        .expect("running farmem trace");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "farmem trace failed: {stderr}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap())
            .expect("trace.json parses");
    (out, json)
}

/// Share (0..1) of the sampled faults at each innermost site, by `file:line` (file name only).
fn shares(json: &Value) -> Vec<(String, f64, String, String)> {
    json["sites_innermost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let place = s["place"].as_str().unwrap();
            let file_line = place.rsplit('/').next().unwrap().to_string();
            (
                file_line,
                s["share"].as_f64().unwrap(),
                s["function"].as_str().unwrap().to_string(),
                s["hint"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_report_finds_the_fault_sites_their_shares_and_hints() {
    let exe = build(true);
    let (out, json) = trace(&exe, &[], "trace-sites");
    let sites = shares(&json);
    let fill = 4096.0;
    let seq = 2.0 * (4096.0 - 256.0);
    let stride = 2.0 * (1024.0 - 64.0);
    let random = 4096.0 * (1.0 - 256.0 / 4096.0);
    let total = fill + seq + stride + random;
    let expect = [
        (marked_line("sites.c", "FILL"), "fill", fill / total),
        (marked_line("sites.c", "SEQ"), "seq_scan", seq / total),
        (
            marked_line("stride.c", "STRIDE"),
            "stride_scan",
            stride / total,
        ),
        (
            marked_line("random.c", "RANDOM"),
            "random_reads",
            random / total,
        ),
    ];
    let mut attributed = 0.0;
    for (line, function, truth) in &expect {
        let got = sites
            .iter()
            .find(|s| &s.0 == line)
            .unwrap_or_else(|| panic!("no site at {line}; sites: {sites:?}\n{}", report(&out)));
        assert_eq!(&got.2, function, "function at {line}");
        assert!(
            (got.1 - truth).abs() <= 0.05,
            "{line}: share {:.3}, truth {truth:.3}\n{}",
            got.1,
            report(&out)
        );
        attributed += got.1;
    }
    assert!(
        attributed >= 0.95,
        "only {attributed:.3} of the faults on the four lines\n{}",
        report(&out)
    );
    let hint_of = |line: &str| sites.iter().find(|s| s.0 == line).unwrap().3.clone();
    assert!(hint_of(&expect[1].0).contains("FM_SEQ"), "{}", report(&out));
    assert!(
        !hint_of(&expect[3].0).contains("FM_SEQ"),
        "{}",
        report(&out)
    );
    assert!(json["sites_covering"]["innermost"].as_u64().unwrap() <= 4);

    // The flame graph of fetches: well-formed, with the hot functions in it.
    let svg = std::fs::read_to_string(out.join("fetch.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("fetch.svg is well-formed XML");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for f in ["seq_scan", "stride_scan", "random_reads", "main"] {
        assert!(
            titles.iter().any(|t| t.starts_with(f)),
            "{f} not in the flame graph"
        );
    }
    roxmltree::Document::parse(&std::fs::read_to_string(out.join("zero-fill.svg")).unwrap())
        .expect("zero-fill.svg is well-formed XML");
    assert!(std::fs::read_to_string(out.join("fetch.folded"))
        .unwrap()
        .contains("main;seq_scan "));

    // Hinted, the scan's line is gone from the report.
    let (out2, json2) = trace(&exe, &["hint-seq"], "trace-hinted");
    let hinted = shares(&json2);
    assert!(
        !hinted.iter().any(|s| s.0 == expect[1].0 && s.1 > 0.01),
        "the hinted scan still faults: {hinted:?}\n{}",
        report(&out2)
    );
    assert!(hinted.iter().any(|s| s.0 == expect[3].0));
}

#[test]
fn a_program_without_debug_information_still_gets_a_report() {
    let exe = build(false);
    let (out, json) = trace(&exe, &[], "trace-nodebug");
    let sites = json["sites_innermost"].as_array().unwrap();
    assert!(!sites.is_empty(), "{}", report(&out));
    let exe_name = exe.file_name().unwrap().to_str().unwrap();
    assert!(
        sites.iter().any(|s| s["place"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{exe_name}+0x"))),
        "no module+offset site in {exe_name}\n{}",
        report(&out)
    );
    assert!(std::fs::read_to_string(out.join("report.txt"))
        .unwrap()
        .contains("site(s) cover 95%"));
}

fn report(out: &Path) -> String {
    std::fs::read_to_string(out.join("report.txt")).unwrap_or_default()
}
