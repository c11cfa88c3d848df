//! The arguments of `#[idempotent(...)]`.

use proc_macro2::{Span, TokenStream};
use proc_macro_crate::FoundCrate;
use syn::parse::{ParseStream, Parser};
use syn::{
    Error, Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Meta, MetaNameValue, Path, Result, Token,
};

/// What the attribute was given.
pub(crate) struct Args {
    /// Where the generated code finds the runtime (`KRATE::__private::guard`).
    pub(crate) krate: Path,
}

/// Parses the attribute's arguments: empty, or `crate = "path"` / `crate = path`.
pub(crate) fn parse(attr: TokenStream) -> Result<Args> {
    let metas = metas.parse2(attr)?;
    let mut krate = None;
    for meta in metas {
        if !meta.path().is_ident("crate") {
            return Err(unknown(&meta));
        }
        let Meta::NameValue(name_value) = &meta else {
            return Err(Error::new_spanned(
                &meta,
                "write `crate = \"path::to::idem\"`",
            ));
        };
        if krate.is_some() {
            return Err(Error::new_spanned(
                &name_value.path,
                "`crate` is given twice: keep one",
            ));
        }
        krate = Some(crate_path(name_value)?);
    }
    Ok(Args {
        krate: krate.unwrap_or_else(idem_as_the_user_names_it),
    })
}

/// The arguments, separated by commas. A missing comma is syn's "expected `,`" where it is
/// missing: it was told that the crate path was wrong (helper-109).
fn metas(input: ParseStream<'_>) -> Result<Vec<Meta>> {
    let mut metas = Vec::new();
    while !input.is_empty() {
        metas.push(meta(input)?);
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    Ok(metas)
}

/// One argument, with what it should have been where it is none.
fn meta(input: ParseStream<'_>) -> Result<Meta> {
    let names_the_crate = input.peek(Token![crate]) && input.peek2(Token![=]);
    input.parse::<Meta>().map_err(|not_meta| {
        // `crate = idem::` was told that the attribute takes no value (helper-92).
        let message = match names_the_crate {
            true => "`crate` takes the path of the idem crate, e.g. `crate = \"::idem\"`",
            false => "#[idempotent] takes no value here: its only argument is `crate = \"...\"`",
        };
        Error::new(not_meta.span(), message)
    })
}

/// `::idem`, or the name the user's `Cargo.toml` gives the `idem` package
/// (`idempotency = { package = "idem", ... }`), so a renamed dependency needs no `crate = ...`.
fn idem_as_the_user_names_it() -> Path {
    match proc_macro_crate::crate_name("idem") {
        Ok(FoundCrate::Name(name)) => {
            let name = Ident::new(&name, Span::call_site());
            syn::parse_quote!(::#name)
        }
        // `Itself`: idem's own examples, tests and benches, which reach it as `::idem`. Not
        // found (a manifest that cannot be read, idem reached through another crate): the
        // compiler's unresolved `::idem` says where, and `crate = ...` is the way out.
        Ok(FoundCrate::Itself) | Err(_) => syn::parse_quote!(::idem),
    }
}

fn unknown(meta: &Meta) -> Error {
    let name = meta.path();
    let shown = quote::quote!(#name).to_string().replace(' ', "");
    Error::new_spanned(
        name,
        format!(
            "unknown argument `{shown}`: the only argument of #[idempotent] is `crate = \"...\"`"
        ),
    )
}

/// Accepts the quoted form like tokio-macros, and the bare path because people write it.
fn crate_path(name_value: &MetaNameValue) -> Result<Path> {
    match &name_value.value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => parse_quoted_path(lit),
        Expr::Path(ExprPath {
            qself: None, path, ..
        }) => Ok(path.clone()),
        other => Err(Error::new_spanned(
            other,
            "`crate` takes the path of the idem crate, e.g. `crate = \"::idem\"`",
        )),
    }
}

fn parse_quoted_path(lit: &LitStr) -> Result<Path> {
    lit.parse_with(Path::parse_mod_style).map_err(|_| {
        Error::new_spanned(
            lit,
            format!(
                "`{}` is not a path: `crate` takes the path of the idem crate, e.g. `crate = \"::idem\"`",
                lit.value()
            ),
        )
    })
}
