//! Charts drawn on the server as SVG, with the same escaping templates as the pages (maud): a
//! line of one figure per completed checkpoint over time (x: trigger time, so gaps such as a
//! failover or a paused job show as gaps, labelled with the first and last checkpoints and their
//! times; checkpoint id when the times do not spread, e.g. all in one millisecond; y: the
//! figure), with the axis range labelled and each point titled with its checkpoint, time and
//! value. Nothing is fetched by the browser.

use std::time::{Duration, UNIX_EPOCH};

use maud::{Markup, html};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 34.0;

/// One point: a checkpoint id, when it was triggered (ms since the epoch) and its figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    pub id: u64,
    pub at_ms: u64,
    pub value: u64,
}

/// `HH:MM:SS` (UTC) of a time in ms since the epoch.
fn time_of_day(ms: u64) -> String {
    let t = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string();
    t.get(11..19).map(str::to_owned).unwrap_or(t)
}

/// Where the points land in the plot area.
fn layout(points: &[Point]) -> Vec<(f64, f64)> {
    let (Some(first), Some(last)) = (points.first(), points.last()) else { return Vec::new() };
    let max = points.iter().map(|p| p.value).max().unwrap_or(0).max(1) as f64;
    // Trigger times come from the leaders' clocks: one that stepped back puts a point before the
    // first one, which is clamped to the axis rather than drawn outside it.
    let by_time = last.at_ms > first.at_ms;
    let offset = |p: &Point| {
        if by_time { p.at_ms.saturating_sub(first.at_ms) } else { p.id.saturating_sub(first.id) }
    };
    let span = offset(last).max(1) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    points
        .iter()
        .map(|p| {
            let x = if points.len() == 1 {
                LEFT + plot_w / 2.0
            } else {
                LEFT + (offset(p) as f64 / span).min(1.0) * plot_w
            };
            let y = TOP + plot_h - (p.value as f64 / max) * plot_h;
            (x, y)
        })
        .collect()
}

/// A line chart of `points` (oldest first); `fmt` renders a value with its unit.
pub fn line_chart(id: &str, title: &str, points: &[Point], fmt: fn(u64) -> String) -> Markup {
    let xy = layout(points);
    let polyline: String = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect::<Vec<_>>().join(" ");
    let max = points.iter().map(|p| p.value).max().unwrap_or(0);
    let bottom = HEIGHT - BOTTOM;
    html! {
        figure.chart {
            figcaption { (title) }
            svg id=(id) xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {WIDTH} {HEIGHT}"))
                width=(WIDTH) height=(HEIGHT) role="img" aria-label=(title) {
                title { (title) }
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(bottom) {}
                line.axis x1=(LEFT) y1=(bottom) x2=(WIDTH - RIGHT) y2=(bottom) {}
                text.label x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" { (fmt(max)) }
                text.label x=(LEFT - 6.0) y=(bottom) text-anchor="end" { (fmt(0)) }
                @if points.is_empty() {
                    text.label x=(WIDTH / 2.0) y=(HEIGHT / 2.0) text-anchor="middle" { "no completed checkpoint yet" }
                } @else {
                    @if let (Some(first), Some(last)) = (points.first(), points.last()) {
                        text.label x=(LEFT) y=(HEIGHT - 12.0) text-anchor="start" { "#" (first.id) " " (time_of_day(first.at_ms)) }
                        text.label x=(WIDTH - RIGHT) y=(HEIGHT - 12.0) text-anchor="end" { "#" (last.id) " " (time_of_day(last.at_ms)) }
                        text.label x=((LEFT + WIDTH - RIGHT) / 2.0) y=(HEIGHT - 2.0) text-anchor="middle" { "time triggered (UTC)" }
                    }
                    polyline.series points=(polyline) {}
                    @for (p, (x, y)) in points.iter().zip(&xy) {
                        circle.point cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="3" {
                            title { "checkpoint " (p.id) " at " (time_of_day(p.at_ms)) ": " (fmt(p.value)) }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_span_the_plot_area() {
        let pts = [
            Point { id: 10, at_ms: 0, value: 0 },
            Point { id: 15, at_ms: 0, value: 50 },
            Point { id: 20, at_ms: 0, value: 100 },
        ];
        let xy = layout(&pts);
        assert_eq!(xy.len(), 3);
        assert!((xy[0].0 - LEFT).abs() < 1e-9);
        assert!((xy[2].0 - (WIDTH - RIGHT)).abs() < 1e-9);
        assert!((xy[2].1 - TOP).abs() < 1e-9, "the largest value is at the top");
        assert!((xy[0].1 - (HEIGHT - BOTTOM)).abs() < 1e-9, "zero is on the x axis");
    }

    #[test]
    fn x_is_the_trigger_time_so_a_pause_shows_as_a_gap() {
        // Checkpoints 1, 2 and 3 a second apart, then 4 nine seconds later (e.g. after a failover).
        let pts = [
            Point { id: 1, at_ms: 10_000, value: 1 },
            Point { id: 2, at_ms: 11_000, value: 1 },
            Point { id: 3, at_ms: 12_000, value: 1 },
            Point { id: 4, at_ms: 21_000, value: 1 },
        ];
        let xy = layout(&pts);
        let plot_w = WIDTH - LEFT - RIGHT;
        assert!((xy[1].0 - (LEFT + plot_w / 11.0)).abs() < 1e-9, "{xy:?}");
        assert!((xy[3].0 - (WIDTH - RIGHT)).abs() < 1e-9, "{xy:?}");
        assert!(xy[3].0 - xy[2].0 > 8.0 * (xy[2].0 - xy[1].0), "the gap is wider: {xy:?}");
        // A point whose time is before the first one's stays on the axis.
        let skewed = [pts[0], Point { id: 2, at_ms: 9_000, value: 1 }, pts[3]];
        assert!((layout(&skewed)[1].0 - LEFT).abs() < 1e-9);
    }

    #[test]
    fn chart_has_one_titled_point_per_checkpoint_and_escapes_its_title() {
        // 2026-01-01T10:00:00Z and a second later.
        let pts = [
            Point { id: 1, at_ms: 1_767_261_600_000, value: 5 },
            Point { id: 2, at_ms: 1_767_261_601_000, value: 9 },
        ];
        let svg = line_chart("c", "<b>duration</b>", &pts, |v| format!("{v} ms")).into_string();
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("checkpoint 2 at 10:00:01: 9 ms"), "{svg}");
        assert!(svg.contains("#1 10:00:00"), "{svg}");
        assert!(svg.contains("&lt;b&gt;duration"));
        assert!(!svg.contains("<b>"));
    }

    #[test]
    fn empty_chart_says_so() {
        let svg = line_chart("c", "t", &[], |v| v.to_string()).into_string();
        assert!(svg.contains("no completed checkpoint yet"));
        assert!(!svg.contains("<polyline"));
    }
}
