//! Function names as reports show them: demangled names without the suffixes of the copies the
//! compiler made of a function, and gfortran's symbols by their Fortran names (a module procedure
//! `__solver_MOD_smooth` as `solver::smooth`, an external procedure `jacobi_sweep_` as
//! `jacobi_sweep`).

/// The name of a (demangled) symbol as reports show it; `fortran_binary`: see [`fortran_name`].
pub(super) fn function_name(symbol: &str, fortran_binary: bool) -> String {
    // GCC's specialised copies (`f [clone .isra.0]` demangled, `f.constprop.0` in C) and split-off
    // parts (`f.cold`, `f.part.0`) run the code of `f`.
    let mut name = symbol;
    while let Some(base) = name
        .strip_suffix(']')
        .and_then(|n| n.rsplit_once(" [clone "))
    {
        name = base.0;
    }
    let name = [".cold", ".part.", ".constprop.", ".isra.", ".lto_priv."]
        .iter()
        .filter_map(|suffix| name.find(suffix).filter(|&i| i > 0))
        .min()
        .map_or(name, |i| &name[..i]);
    fortran_name(name, fortran_binary).unwrap_or_else(|| name.to_string())
}

/// The Fortran name of a gfortran symbol, or `None` when `symbol` is not one. The trailing
/// underscore of external procedures is taken off only in a binary that uses the GNU Fortran
/// runtime (`fortran_binary`): a C function may end in an underscore as well.
fn fortran_name(symbol: &str, fortran_binary: bool) -> Option<String> {
    if let Some((module, procedure)) = symbol
        .strip_prefix("__")
        .and_then(|rest| rest.split_once("_MOD_"))
    {
        if is_identifier(module) && is_identifier(procedure) {
            return Some(format!("{module}::{procedure}"));
        }
    }
    let external = symbol.strip_suffix('_')?;
    (fortran_binary
        && !external.ends_with('_')
        && is_identifier(external)
        && !external.starts_with('_'))
    .then(|| external.to_string())
}

/// A name gfortran emits for a procedure: lower-case letters, digits and underscores.
fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::{fortran_name, function_name};

    #[test]
    fn copies_made_by_the_compiler_are_named_by_their_function() {
        assert_eq!(
            function_name("solver::Grid<int>::relax(int) [clone .isra.0]", false),
            "solver::Grid<int>::relax(int)"
        );
        assert_eq!(function_name("smooth.part.0", false), "smooth");
        assert_eq!(function_name("smooth.cold", false), "smooth");
        assert_eq!(function_name("smooth_.constprop.0", true), "smooth");
        assert_eq!(function_name("smooth.isra.0", false), "smooth");
    }

    #[test]
    fn module_and_external_procedures_get_their_fortran_names() {
        assert_eq!(
            fortran_name("__solver_MOD_smooth", false).as_deref(),
            Some("solver::smooth")
        );
        assert_eq!(
            fortran_name("jacobi_sweep_", true).as_deref(),
            Some("jacobi_sweep")
        );
        // Outside a Fortran binary an underscore is part of a C name.
        assert_eq!(fortran_name("jacobi_sweep_", false), None);
        // The main program and runtime symbols are not procedures of the user's.
        assert_eq!(fortran_name("MAIN__", true), None);
        assert_eq!(fortran_name("_gfortran_st_write", true), None);
        assert_eq!(fortran_name("main", true), None);
    }
}
