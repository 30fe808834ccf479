//! Regression of one quantity (a phase's weight or its execution time) on the workload value, as
//! the workload model of Martínez Canillas (2011) does it: a family from the common time
//! complexities (his Table 2.1), fitted to the measured points, and chosen by how well it predicts
//! a measured point it was not fitted to.
//!
//! * **Families**: constant, log n, n, n log n, n², n³, each with a constant term. Exponential and
//!   factorial growth are left out: with a handful of measured points they cannot be told apart
//!   from a polynomial, and they extrapolate wildly. One more family is for repetition counts
//!   that a run stops short of, as codes that stop at a simulated end time or at an iteration
//!   cap, whichever comes first: a line up to a cap, min(a + b·n, cap). Its cap is the value the
//!   runs of the largest workloads share (iteration counts are exact, so they share it exactly)
//!   and its line is fitted to the runs below the cap; it needs two runs below and one at the
//!   cap.
//! * **Fit**: least squares over the points, which is the exact interpolation when there are as
//!   many points as coefficients (the thesis's two-point line and three-point parabola).
//! * **Choice** ([`select`]): each family with fewer coefficients than points is fitted without
//!   each interior point in turn (never without an end point, so every check is an
//!   interpolation, which is what the model is for) and predicts it; its validation error is the
//!   largest relative miss. The family chosen is the one with the fewest coefficients whose error
//!   is within the tolerance (ties: the smaller error); when none is, the smallest error, marked as
//!   above the tolerance. The thesis promotes a family only when the held-out error exceeds a
//!   threshold it does not give; ours is [`DEFAULT_TOLERANCE`].

use serde::Serialize;

/// Largest relative validation error a family may have to be chosen over one with more
/// coefficients.
pub const DEFAULT_TOLERANCE: f64 = 0.05;

/// A model family: f(x) = a + b·g(x) (+ c·x² + d·x³ for the polynomials).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Constant,
    Log,
    Linear,
    NLogN,
    /// min(a + b·x, cap).
    CappedLinear,
    Quadratic,
    Cubic,
}

impl Family {
    /// In the order the choice prefers them: fewer coefficients first.
    pub const ALL: [Family; 7] = [
        Family::Constant,
        Family::Log,
        Family::Linear,
        Family::NLogN,
        Family::CappedLinear,
        Family::Quadratic,
        Family::Cubic,
    ];

    pub fn coefficients(self) -> usize {
        match self {
            Family::Constant => 1,
            Family::Log | Family::Linear | Family::NLogN => 2,
            Family::CappedLinear | Family::Quadratic => 3,
            Family::Cubic => 4,
        }
    }

    /// The basis functions at x: the fitted value is Σ coefficient_j · basis_j(x), but for the
    /// capped line, whose first two are its line's.
    fn basis(self, x: f64) -> Vec<f64> {
        match self {
            Family::Constant => vec![1.0],
            Family::Log => vec![1.0, x.ln()],
            Family::Linear | Family::CappedLinear => vec![1.0, x],
            Family::NLogN => vec![1.0, x * x.ln()],
            Family::Quadratic => vec![1.0, x, x * x],
            Family::Cubic => vec![1.0, x, x * x, x * x * x],
        }
    }

    /// Whether the family is defined at x (the logarithmic ones need x > 0).
    fn defined_at(self, x: f64) -> bool {
        !matches!(self, Family::Log | Family::NLogN) || x > 0.0
    }

    /// The formula with the coefficients filled in, for people.
    pub fn formula(self, c: &[f64]) -> String {
        let terms: Vec<String> = match self {
            Family::Constant => vec![fmt(c[0])],
            Family::Log => vec![fmt(c[0]), format!("{}·ln x", fmt(c[1]))],
            Family::Linear => vec![fmt(c[0]), format!("{}·x", fmt(c[1]))],
            Family::NLogN => vec![fmt(c[0]), format!("{}·x ln x", fmt(c[1]))],
            Family::CappedLinear => {
                let line = format!("{} + {}·x", fmt(c[0]), fmt(c[1])).replace("+ -", "- ");
                return format!("min({line}, {})", fmt(c[2]));
            }
            Family::Quadratic => vec![
                fmt(c[0]),
                format!("{}·x", fmt(c[1])),
                format!("{}·x²", fmt(c[2])),
            ],
            Family::Cubic => vec![
                fmt(c[0]),
                format!("{}·x", fmt(c[1])),
                format!("{}·x²", fmt(c[2])),
                format!("{}·x³", fmt(c[3])),
            ],
        };
        terms.join(" + ").replace("+ -", "- ")
    }
}

fn fmt(v: f64) -> String {
    format!("{v:.4e}")
}

/// A fitted family.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub family: Family,
    /// Of the basis functions, in the order of [`Family::formula`].
    pub coefficients: Vec<f64>,
    /// Largest relative miss on a held-out interior point; `None` when no point could be held
    /// out (fewer than three points, or no family with fewer coefficients than points).
    pub validation_error: Option<f64>,
    /// The validation error is above the tolerance: no family predicts the measured points well.
    pub above_tolerance: bool,
}

impl Fit {
    pub fn eval(&self, x: f64) -> f64 {
        let value = self
            .family
            .basis(x)
            .iter()
            .zip(&self.coefficients)
            .map(|(b, c)| b * c)
            .sum();
        match self.family {
            Family::CappedLinear => f64::min(value, self.coefficients[2]),
            _ => value,
        }
    }
}

/// Measured points: (workload, value).
type Points = [(f64, f64)];

/// The points below the cap and those at it (the largest workloads' points that share the last
/// value, to one part in 10⁹), of points sorted by workload.
fn split_at_cap(sorted: &Points) -> (&Points, &Points) {
    let Some(&(_, cap)) = sorted.last() else {
        return (sorted, &[]);
    };
    let at_cap = sorted
        .iter()
        .rev()
        .take_while(|&&(_, y)| (y - cap).abs() <= 1e-9 * cap.abs())
        .count();
    sorted.split_at(sorted.len() - at_cap)
}

/// The capped line through `points`: the cap is the value of the largest workloads' points, the
/// line the least-squares one through the others, which must be two or more and below the cap.
/// `None` when the points are not of that shape.
fn capped_line(points: &[(f64, f64)]) -> Option<Vec<f64>> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (below, at_cap) = split_at_cap(&sorted);
    let cap = at_cap.first()?.1;
    if below.len() < 2 {
        return None;
    }
    let line = least_squares(Family::Linear, below)?;
    // The line reaches the cap after the last point below it, rising.
    let last_below = below[below.len() - 1].0;
    if line[1] <= 0.0 || line[0] + line[1] * last_below > cap {
        return None;
    }
    Some(vec![line[0], line[1], cap])
}

/// Least-squares coefficients of `family` through `points` (x, y); `None` when there are fewer
/// points than coefficients, the family is undefined at a point, the points do not determine
/// the coefficients (repeated x values), or they are not of a capped line's shape (see the
/// module docs).
pub fn least_squares(family: Family, points: &[(f64, f64)]) -> Option<Vec<f64>> {
    if family == Family::CappedLinear {
        return capped_line(points);
    }
    let k = family.coefficients();
    if points.len() < k || points.iter().any(|&(x, _)| !family.defined_at(x)) {
        return None;
    }
    let rows: Vec<Vec<f64>> = points.iter().map(|&(x, _)| family.basis(x)).collect();
    // Each column scaled to unit length first: x³ of workloads in the thousands is 10⁹ times x,
    // and the normal equations square the columns' condition.
    let scale: Vec<f64> = (0..k)
        .map(|j| rows.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .collect();
    if scale.iter().any(|&s| s == 0.0 || !s.is_finite()) {
        return None;
    }
    let mut a = vec![vec![0.0; k + 1]; k];
    for (row, &(_, y)) in rows.iter().zip(points) {
        for i in 0..k {
            for j in 0..k {
                a[i][j] += row[i] / scale[i] * row[j] / scale[j];
            }
            a[i][k] += row[i] / scale[i] * y;
        }
    }
    let solved = solve(a)?;
    Some(solved.iter().zip(&scale).map(|(c, s)| c / s).collect())
}

/// Gaussian elimination with partial pivoting on the augmented matrix [A | b].
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let (upper, lower) = a.split_at_mut(col + 1);
        let pivot_row = &upper[col];
        for row in lower {
            let factor = row[col] / pivot_row[col];
            for (value, above) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *value -= factor * above;
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let rest: f64 = (row + 1..n).map(|j| a[row][j] * x[j]).sum();
        x[row] = (a[row][n] - rest) / a[row][row];
    }
    Some(x)
}

/// |predicted − measured| ÷ |reference|; an absolute miss when the reference is 0 (a phase that
/// does not run at that workload).
fn relative_error(predicted: f64, measured: f64, reference: f64) -> f64 {
    let miss = (predicted - measured).abs();
    if reference == 0.0 {
        miss
    } else {
        miss / reference.abs()
    }
}

/// The largest relative miss of `family` on the interior points of `points` (sorted by x), each
/// predicted by a fit without it and its miss divided by `reference(i)`; `None` when the family
/// cannot be checked that way.
fn validation_error(
    family: Family,
    points: &[(f64, f64)],
    reference: &dyn Fn(usize) -> f64,
) -> Option<f64> {
    if points.len() < 3 || family.coefficients() >= points.len() {
        return None;
    }
    let mut worst: Option<f64> = None;
    for held in 1..points.len() - 1 {
        let rest: Vec<(f64, f64)> = points
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != held)
            .map(|(_, &p)| p)
            .collect();
        let coefficients = match least_squares(family, &rest) {
            Some(c) => c,
            // Without a point below the cap, the rest has too few to draw the line: the other
            // held-out points check it.
            None if family == Family::CappedLinear => continue,
            None => return None,
        };
        let fit = Fit {
            family,
            coefficients,
            validation_error: None,
            above_tolerance: false,
        };
        let (x, y) = points[held];
        let error = relative_error(fit.eval(x), y, reference(held));
        worst = Some(worst.map_or(error, |w: f64| w.max(error)));
    }
    worst
}

/// The family that best explains `points` (x, y) by the rule in the module's documentation,
/// fitted to all of them, its misses relative to the measured values. `None` without points.
/// With one point the fit is its constant; with two, the line through them (or the constant when
/// both values are equal), unvalidated.
pub fn select(points: &[(f64, f64)], tolerance: f64) -> Option<Fit> {
    let with_reference: Vec<(f64, f64, f64)> = points.iter().map(|&(x, y)| (x, y, y)).collect();
    select_relative_to(&with_reference, tolerance)
}

/// [`select`] with each point's miss relative to a value of its own: (x, y, reference). The time
/// no phase covers is a small part of a run, and a miss on it matters as a part of the run time.
pub fn select_relative_to(points: &[(f64, f64, f64)], tolerance: f64) -> Option<Fit> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let points: Vec<(f64, f64)> = sorted.iter().map(|&(x, y, _)| (x, y)).collect();
    let reference = |i: usize| sorted[i].2;
    let fitted = |family: Family, validation_error: Option<f64>, above_tolerance| {
        least_squares(family, &points).map(|coefficients| Fit {
            family,
            coefficients,
            validation_error,
            above_tolerance,
        })
    };
    let first = points.first()?.1;
    if points.iter().all(|&(_, y)| y == first) {
        return fitted(Family::Constant, None, false);
    }
    // A cap is a value two runs or more share exactly: one run's value is no cap.
    let capped = split_at_cap(&points).1.len() >= 2;
    let checked: Vec<(Family, f64)> = Family::ALL
        .iter()
        .filter(|&&f| f != Family::CappedLinear || capped)
        .filter_map(|&f| validation_error(f, &points, &reference).map(|e| (f, e)))
        .collect();
    let best_within = checked
        .iter()
        .filter(|(_, e)| *e <= tolerance)
        .min_by(|a, b| (a.0.coefficients().cmp(&b.0.coefficients())).then(a.1.total_cmp(&b.1)));
    if let Some(&(family, error)) = best_within {
        return fitted(family, Some(error), false);
    }
    if let Some(&(family, error)) = checked.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        return fitted(family, Some(error), true);
    }
    // Too few points to hold one out: the most the points determine.
    let family = if points.len() >= 2 {
        Family::Linear
    } else {
        Family::Constant
    };
    fitted(family, None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    fn exact(family: Family, points: &[(f64, f64)]) -> Fit {
        Fit {
            family,
            coefficients: least_squares(family, points).unwrap(),
            validation_error: None,
            above_tolerance: false,
        }
    }

    /// Martínez Canillas (2011), Tables 6.2 and 6.4: the synthetic application's phase times at
    /// vector lengths 1000, 2000, 3000, predicted at 2500.
    #[test]
    fn the_thesis_predictions_of_its_synthetic_application() {
        let p1 = [(2000.0, 0.0002157), (3000.0, 0.0003280)];
        assert!(close(
            exact(Family::Linear, &p1).eval(2500.0),
            0.00027185,
            1e-9
        ));
        let p2_bracket = [(2000.0, 1.34379), (3000.0, 3.02133)];
        assert!(close(
            exact(Family::Linear, &p2_bracket).eval(2500.0),
            2.18256,
            1e-9
        ));
        let p2 = [(1000.0, 0.33682), (2000.0, 1.34379), (3000.0, 3.02133)];
        let quadratic = exact(Family::Quadratic, &p2);
        assert!(close(quadratic.eval(2500.0), 2.09873875, 1e-9));
        // The least-squares line through all three points is not the thesis's "linear".
        assert!(close(
            exact(Family::Linear, &p2).eval(2500.0),
            2.2384408,
            1e-7
        ));
        // PAET = Σ PET·W with the weights 100 and 99 of Table 6.2.
        let paet = 100.0 * 0.00027185 + 99.0 * quadratic.eval(2500.0);
        assert!(close(paet, 207.80232, 1e-6));
        assert!(close(relative_error(207.80, 209.87, 209.87), 0.00986, 1e-3));
    }

    #[test]
    fn each_law_is_recognised_from_four_points() {
        let xs = [4.0, 6.0, 8.0, 10.0];
        type Law = fn(f64) -> f64;
        let laws: [(Family, Law); 4] = [
            (Family::Constant, |_| 7.0),
            (Family::Linear, |x| 3.0 + 2.0 * x),
            (Family::Quadratic, |x| 1.0 + 0.5 * x + 0.25 * x * x),
            (Family::Log, |x| 2.0 + 5.0 * x.ln()),
        ];
        for (family, law) in laws {
            let points: Vec<(f64, f64)> = xs.iter().map(|&x| (x, law(x))).collect();
            let fit = select(&points, DEFAULT_TOLERANCE).unwrap();
            assert_eq!(fit.family, family, "{points:?}");
            assert!(close(fit.eval(7.0), law(7.0), 1e-9));
        }
    }

    #[test]
    fn noisy_quadratic_times_choose_the_quadratic() {
        // n² law with ±1 % measurement noise: a line misses the held-out points by far more.
        let points = [
            (4.0, 16.0 * 1.01),
            (6.0, 36.0 * 0.99),
            (8.0, 64.0 * 1.005),
            (10.0, 100.0),
        ];
        let fit = select(&points, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(fit.family, Family::Quadratic);
        assert!(close(fit.eval(7.0), 49.0, 0.02));
        assert!(!fit.above_tolerance);
    }

    #[test]
    fn repetitions_that_stop_at_a_cap_are_a_capped_line() {
        // 10 iterations per unit of n, at most 75: the runs at 8 and 10 stop at the cap.
        let law = |x: f64| f64::min(10.0 * x, 75.0);
        let points: Vec<(f64, f64)> = [4.0, 6.0, 8.0, 10.0].map(|x| (x, law(x))).into();
        let fit = select(&points, DEFAULT_TOLERANCE).unwrap();
        assert_eq!(fit.family, Family::CappedLinear, "{fit:?}");
        assert!(!fit.above_tolerance);
        for x in [5.0, 7.0, 7.5, 9.0, 12.0] {
            assert!(close(fit.eval(x), law(x), 1e-9), "at {x}: {}", fit.eval(x));
        }
        assert_eq!(
            Family::CappedLinear.formula(&[1.0, -2.0, 75.0]),
            "min(1.0000e0 - 2.0000e0·x, 7.5000e1)"
        );
        // Without a cap the same family is not chosen: a line is a line, and one run's value is
        // no cap.
        let line: Vec<(f64, f64)> = [4.0, 6.0, 8.0, 10.0].map(|x| (x, 10.0 * x)).into();
        assert_eq!(
            select(&line, DEFAULT_TOLERANCE).unwrap().family,
            Family::Linear
        );
        let quadratic: Vec<(f64, f64)> = [4.0, 6.0, 8.0, 10.0].map(|x| (x, x * x)).into();
        assert_eq!(
            select(&quadratic, DEFAULT_TOLERANCE).unwrap().family,
            Family::Quadratic
        );
        // Times that fall at the largest workloads are no cap: the line must rise to it.
        assert_eq!(
            capped_line(&[(4.0, 40.0), (6.0, 80.0), (8.0, 50.0), (10.0, 50.0)]),
            None
        );
    }

    #[test]
    fn too_few_points_are_fitted_without_validation() {
        let one = select(&[(3.0, 5.0)], DEFAULT_TOLERANCE).unwrap();
        assert_eq!((one.family, one.eval(9.0)), (Family::Constant, 5.0));
        let two = select(&[(2.0, 4.0), (4.0, 8.0)], DEFAULT_TOLERANCE).unwrap();
        assert_eq!(two.family, Family::Linear);
        assert!(close(two.eval(3.0), 6.0, 1e-12));
        assert_eq!(two.validation_error, None);
        assert_eq!(select(&[], DEFAULT_TOLERANCE), None);
    }

    #[test]
    fn repeated_workload_values_do_not_determine_a_line() {
        assert_eq!(
            least_squares(Family::Linear, &[(2.0, 1.0), (2.0, 3.0)]),
            None
        );
        assert_eq!(least_squares(Family::Log, &[(0.0, 1.0), (2.0, 3.0)]), None);
    }

    #[test]
    fn formulas_read_like_the_fitted_function() {
        assert_eq!(
            Family::Quadratic.formula(&[1.0, -2.0, 0.5]),
            "1.0000e0 - 2.0000e0·x + 5.0000e-1·x²"
        );
    }
}
