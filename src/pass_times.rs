//! Compile time per stage (`adjoint run --time-passes`): a `tracing`
//! layer that adds up the time spent inside the compiler's stage spans
//! (target `adjoint::pass`), keyed by the chain of stage names that
//! contain it, and prints them as a table.
//!
//! The compiler only opens spans; nothing is measured unless a program
//! installs this layer (the `adjoint` command does with `--time-passes`;
//! an embedder can do the same with [`PassTimes::layer`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The target of the compiler's stage spans.
pub const TARGET: &str = "adjoint::pass";

/// One stage: where it sits and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct StageTime {
    /// The stage's name after the names of the stages containing it.
    pub path: Vec<&'static str>,
    /// Time inside the stage, its sub-stages included.
    pub total: Duration,
    /// How many times it ran.
    pub calls: usize,
}

#[derive(Default)]
struct Table {
    /// Rows in the order stages were first entered.
    rows: Vec<StageTime>,
    index: HashMap<Vec<&'static str>, usize>,
}

/// The times the layer has measured so far (shared with the layer).
#[derive(Clone, Default)]
pub struct PassTimes {
    table: Arc<Mutex<Table>>,
}

/// What a span keeps while it is open: its path and when it was entered.
struct Open {
    path: Vec<&'static str>,
    since: Option<Instant>,
}

impl PassTimes {
    /// An empty table.
    pub fn new() -> PassTimes {
        PassTimes::default()
    }

    /// The layer that fills this table.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        use tracing_subscriber::filter::{LevelFilter, Targets};
        TimerLayer {
            table: self.table.clone(),
        }
        .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE))
    }

    /// The stages measured, in the order they first ran.
    pub fn stages(&self) -> Vec<StageTime> {
        self.lock().rows.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The table as text: one line a stage, indented under the stage that
    /// contains it, with its share of `total` (the whole compile).
    pub fn describe(&self, total: Duration) -> String {
        let rows = self.stages();
        let width = rows
            .iter()
            .map(|r| 2 * (r.path.len() - 1) + r.path.last().map_or(0, |s| s.len()))
            .max()
            .unwrap_or(0)
            .max(5);
        let mut out = format!(
            "{:<width$}  {:>10}  {:>6}  {:>6}\n",
            "stage", "ms", "%", "calls"
        );
        for r in &rows {
            let name = format!(
                "{}{}",
                "  ".repeat(r.path.len() - 1),
                r.path.last().copied().unwrap_or("")
            );
            let share = if total.is_zero() {
                0.0
            } else {
                100.0 * r.total.as_secs_f64() / total.as_secs_f64()
            };
            out += &format!(
                "{name:<width$}  {:>10.2}  {share:>6.1}  {:>6}\n",
                r.total.as_secs_f64() * 1e3,
                r.calls
            );
        }
        out
    }
}

struct TimerLayer {
    table: Arc<Mutex<Table>>,
}

impl<S> Layer<S> for TimerLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut path = span
            .parent()
            .and_then(|p| p.extensions().get::<Open>().map(|o| o.path.clone()))
            .unwrap_or_default();
        path.push(attrs.metadata().name());
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let i = match t.index.get(&path) {
            Some(i) => *i,
            None => {
                let i = t.rows.len();
                t.index.insert(path.clone(), i);
                t.rows.push(StageTime {
                    path: path.clone(),
                    total: Duration::ZERO,
                    calls: 0,
                });
                i
            }
        };
        t.rows[i].calls += 1;
        drop(t);
        span.extensions_mut().insert(Open { path, since: None });
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(open) = span.extensions_mut().get_mut::<Open>() {
                open.since = Some(Instant::now());
            }
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(open) = ext.get_mut::<Open>() else {
            return;
        };
        let Some(since) = open.since.take() else {
            return;
        };
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = t.index.get(&open.path) {
            t.rows[i].total += since.elapsed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    #[test]
    fn nested_stages_add_up_by_path() {
        let times = PassTimes::new();
        let subscriber = tracing_subscriber::registry().with(times.layer());
        tracing::subscriber::with_default(subscriber, || {
            let _outer = tracing::info_span!(target: "adjoint::pass", "optimise").entered();
            for _ in 0..3 {
                let _inner = tracing::info_span!(target: "adjoint::pass", "round").entered();
                std::thread::sleep(Duration::from_millis(2));
            }
            // other targets are not stages
            let _other = tracing::info_span!(target: "adjoint::opt", "other").entered();
        });
        let stages = times.stages();
        let paths: Vec<_> = stages.iter().map(|s| (s.path.clone(), s.calls)).collect();
        assert_eq!(
            paths,
            vec![(vec!["optimise"], 1), (vec!["optimise", "round"], 3)]
        );
        assert!(stages[1].total >= Duration::from_millis(6));
        assert!(stages[0].total >= stages[1].total);
        let text = times.describe(stages[0].total);
        assert!(text.contains("  round"), "{text}");
        assert!(text.contains("100.0"), "{text}");
    }
}
