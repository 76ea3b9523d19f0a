//! Waiting for the demo job's committed output to be complete and exactly once.

use std::path::Path;
use std::time::Duration;

use cairn_taskrt::demo::verify::{Expectation, Verdict, Violation, verify_output};

use crate::wait;

/// Waits (bounded by `timeout`) until the committed output in `output` meets `expect` exactly
/// once, and returns that verdict. Anything but incompleteness (a duplicate, a gap, a wrong
/// sequence) fails at once; a timeout names the last verdict.
pub async fn until_exactly_once(
    output: &Path,
    expect: &Expectation,
    timeout: Duration,
) -> anyhow::Result<Verdict> {
    let last = std::cell::RefCell::new(String::new());
    let done = wait::until("the committed output to be complete and exactly once", timeout, || async {
        let verdict = verify_output(output, expect).ok()?;
        let hard: Vec<String> = verdict
            .violations
            .iter()
            .filter(|v| !matches!(v, Violation::WrongTotal { .. } | Violation::MissingKey { .. }))
            .map(ToString::to_string)
            .collect();
        assert!(hard.is_empty(), "exactly-once violated: {hard:?}");
        *last.borrow_mut() = verdict.to_string();
        verdict.is_exactly_once().then_some(verdict)
    })
    .await;
    done.map_err(|e| anyhow::anyhow!("{e}; last verdict: {}", last.borrow()))
}
