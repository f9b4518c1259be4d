//! Integrity under churn (see `common/churn.rs`) on the embedded backends, with one and two
//! fault threads. The embedded stores forget a page's far copy when it is fetched
//! (`FarCopies::Drop`); one run keeps only clean copies, one every copy, as remote tiers do.

use farmem_runtime::testing::churn::{churn, BUDGET};
use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, FarCopies, PolicyKind, Runtime};

#[test]
fn random_records_under_churn() {
    churn(runtime(BUDGET as u64, 32, 64));
}

#[test]
fn random_records_under_churn_lz4() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::Local { lz4: true },
        evict_batch: 16,
        ..Config::default()
    })
    .unwrap();
    assert_eq!(rt.backend_name(), "local+lz4");
    churn(rt);
}

#[test]
fn random_records_under_churn_keeping_far_copies() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::Local { lz4: true },
        evict_batch: 16,
        far_copies: Some(FarCopies::Keep),
        ..Config::default()
    })
    .unwrap();
    churn(rt);
}

/// The compressed tier with zstd instead of LZ4.
#[test]
fn random_records_under_churn_compressed_with_zstd() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::Local { lz4: true },
        compressor: farmem_runtime::backend::Codec::Zstd(3),
        evict_batch: 16,
        ..Config::default()
    })
    .unwrap();
    assert_eq!(rt.backend_name(), "local+zstd:3");
    churn(rt);
}

#[test]
fn random_records_under_churn_in_a_file() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::File {
            dir: farmem_runtime::default_far_dir(),
            max_bytes: None,
        },
        evict_batch: 32,
        ..Config::default()
    })
    .unwrap();
    churn(rt);
}

/// Compressed DRAM capped at 1 MiB in front of a file: most pages spill to the file.
#[test]
fn random_records_under_churn_tiered() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::Tiered {
            dir: farmem_runtime::default_far_dir(),
            compressed_max: Some(1 << 20),
        },
        evict_batch: 32,
        ..Config::default()
    })
    .unwrap();
    churn(rt);
}

#[test]
fn random_records_under_churn_keeping_clean_copies() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        evict_batch: 16,
        far_copies: Some(FarCopies::Clean),
        ..Config::default()
    })
    .unwrap();
    churn(rt);
}

#[test]
fn random_records_under_churn_two_fault_threads() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        evict_batch: 64,
        fault_readahead: 0,
        fault_threads: 2,
        ..Config::default()
    })
    .unwrap();
    churn(rt);
}

/// The same churn under each policy that reads the use bits (hints and faults clear `IDLE`,
/// the hands set it): evictions chosen by recency and priority must lose nothing either.
fn churn_with_policy(name: &str) {
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        evict_batch: 32,
        policy: PolicyKind::parse(name).unwrap(),
        ..Config::default()
    })
    .unwrap();
    assert_eq!(rt.policy_name(), name);
    churn(rt);
}

#[test]
fn random_records_under_churn_second_chance() {
    churn_with_policy("second-chance");
}

#[test]
fn random_records_under_churn_lru() {
    churn_with_policy("lru");
}

#[test]
fn random_records_under_churn_priority() {
    churn_with_policy("priority");
}
