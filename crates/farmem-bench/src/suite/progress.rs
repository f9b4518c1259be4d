//! Progress while the suite runs: the run in progress, how many are done, elapsed time and an
//! estimate of what is left. A bar on a terminal; one line per run otherwise (CI logs).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    start: Instant,
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} runs  {elapsed_precise} elapsed, ~{msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        Progress {
            bar,
            total,
            done: 0,
            start: Instant::now(),
        }
    }

    /// The run that starts now.
    pub fn begin(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(format!("{} left; now {what}", self.estimate()));
            b.tick();
        }
    }

    /// The run that ended, and how (printed above the bar, or as a log line).
    pub fn end(&mut self, what: &str, how: &str) {
        self.done += 1;
        let line = format!(
            "[{}/{} {} elapsed, ~{} left] {what}: {how}",
            self.done,
            self.total,
            clock(self.start.elapsed()),
            self.estimate()
        );
        match &self.bar {
            Some(b) => {
                b.set_position(self.done);
                b.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    /// Anything else to say (printed above the bar).
    pub fn note(&self, s: &str) {
        match &self.bar {
            Some(b) => b.println(s),
            None => eprintln!("{s}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    /// Time left at the average pace so far (runs differ a lot, so it is rough until a few
    /// of each kind are done).
    fn estimate(&self) -> String {
        if self.done == 0 {
            return "?".into();
        }
        let per = self.start.elapsed().as_secs_f64() / self.done as f64;
        clock(Duration::from_secs_f64(
            per * self.total.saturating_sub(self.done) as f64,
        ))
    }
}

/// h:mm:ss
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}
