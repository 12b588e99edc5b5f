//! Runs named tests of the current test binary again, once per compiled kernel path
//! other than the one this process takes (`TOKENROUTER_KERNEL`, see
//! `tokenrouter_core::model::simd`), so a suite that checks the model's numbers holds on
//! the portable fallback and every vector instruction set, not only the widest.

use std::process::Command;

use tokenrouter_core::model::simd::KernelPath;

/// Fails, with the child's output, when any of `tests` fails on any other path.
pub fn rerun_on_other_kernel_paths(tests: &[&str]) {
    let active = KernelPath::active();
    let exe = std::env::current_exe().expect("the test binary's path");
    for path in KernelPath::compiled().into_iter().filter(|&p| p != active) {
        let output = Command::new(&exe)
            .arg("--exact")
            .args(tests)
            .env("TOKENROUTER_KERNEL", path.name())
            .output()
            .expect("the test binary runs again");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "on the {} kernel path:\n{stdout}\n{}",
            path.name(),
            String::from_utf8_lossy(&output.stderr)
        );
        // An exact filter that matches nothing passes silently; make sure each ran.
        let passed = stdout.lines().filter(|l| l.ends_with("... ok")).count();
        assert_eq!(passed, tests.len(), "on the {} kernel path, ran:\n{stdout}", path.name());
        println!("{} tests passed on the {} kernel path", tests.len(), path.name());
    }
}
