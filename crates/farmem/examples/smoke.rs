use farmem::{Config, Runtime};
fn main() {
    let rt = Runtime::new(Config { local_mem: 4 << 20, ..Config::default() }).unwrap();
    let r = rt.create_region(64 << 20).unwrap();
    let n = r.len() / 4096;
    let p = r.as_mut_ptr();
    for i in 0..n { unsafe { (p.add(i * 4096) as *mut u64).write(i as u64 * 7 + 1) } }
    println!("written");
    let mut bad = 0;
    for i in 0..n { if unsafe { (p.add(i * 4096) as *const u64).read() } != i as u64 * 7 + 1 { bad += 1 } }
    for i in (0..n).rev() { farmem::hint(unsafe{p.add(i*4096)}); if unsafe { (p.add(i * 4096) as *const u64).read() } != i as u64 * 7 + 1 { bad += 1 } }
    println!("bad={bad}\n{}", rt.stats());
}
