//! Checks that the attribute sits on something it can wrap: a method with `self`, async or
//! returning a future, that receives the request's `Extensions`.
//!
//! Only the signature is parsed; the body stays tokens (as tracing-attributes does), so a
//! syntax error in it is the compiler's to report, where it is.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{
    braced, Attribute, Error, FnArg, GenericArgument, Ident, Item, Pat, PathArguments, Result,
    ReturnType, Signature, Type, TypeParamBound, Visibility,
};

/// A function whose body is kept as written.
pub(crate) struct FnTokens {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The body's own `#![...]` attributes, which must stay first in the function's body.
    pub(crate) inner_attrs: Vec<Attribute>,
    /// What is between the body's braces, after its inner attributes.
    pub(crate) body: TokenStream,
}

impl Parse for FnTokens {
    fn parse(input: ParseStream) -> Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let content;
        braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body = content.parse()?;
        Ok(Self {
            attrs,
            vis,
            sig,
            inner_attrs,
            body,
        })
    }
}

/// A method that `#[idempotent]` can wrap.
pub(crate) struct Method {
    pub(crate) func: FnTokens,
    /// The `&Extensions` parameter, handed to the guard.
    pub(crate) ext: Ident,
    pub(crate) shape: Shape,
}

/// How the method produces its future, which decides how the guard is spliced in.
pub(crate) enum Shape {
    /// `async fn`; carries the declared return type.
    Async(Box<Type>),
    /// What `#[async_trait]` leaves: `fn ... -> Pin<Box<dyn Future<...> + Send + '_>>`, or a
    /// `BoxFuture<'_, ...>`; carries the future's `Output` type where it is spelled out.
    BoxedFuture(Option<Box<Type>>),
    /// `fn ... -> impl Future<...>`.
    ImplFuture,
}

const NOT_A_METHOD: &str = "#[idempotent] goes on a method of an `impl ...Server for ...` block";
const ON_AN_IMPL: &str = "#[idempotent] goes on each method to guard, not on the impl block: \
                          move it onto the send methods";

/// Parses and validates the item the attribute is on; `None` for a function whose signature
/// does not parse, which the compiler has reported already, where it is (a message of ours
/// beside it would only mislead).
pub(crate) fn parse(item: TokenStream) -> Result<Option<Method>> {
    let func = match syn::parse2::<FnTokens>(item.clone()) {
        Ok(func) => func,
        Err(_) => match syn::parse2::<Item>(item.clone()) {
            Ok(Item::Impl(i)) => return Err(Error::new_spanned(head(&Item::Impl(i)), ON_AN_IMPL)),
            Ok(other) => return Err(Error::new_spanned(head(&other), NOT_A_METHOD)),
            Err(_) if names_a_function(&item) => return Ok(None),
            Err(_) => return Err(Error::new_spanned(item, NOT_A_METHOD)),
        },
    };
    require_receiver(&func.sig)?;
    refuse_a_second_attribute(&func.attrs)?;
    let shape = shape(&func.sig)?;
    let ext = extensions_param(&func.sig)?;
    Ok(Some(Method { func, ext, shape }))
}

/// Whether the item's own tokens (not those of its body) hold `fn`.
fn names_a_function(item: &TokenStream) -> bool {
    item.clone()
        .into_iter()
        .any(|token| matches!(token, proc_macro2::TokenTree::Ident(ident) if ident == "fn"))
}

/// Points at `struct Foo` rather than the whole item, so the message stays on one line.
fn head(item: &Item) -> TokenStream {
    match item {
        Item::Struct(s) => {
            let (token, ident) = (&s.struct_token, &s.ident);
            quote!(#token #ident)
        }
        Item::Enum(e) => {
            let (token, ident) = (&e.enum_token, &e.ident);
            quote!(#token #ident)
        }
        Item::Trait(t) => {
            let (token, ident) = (&t.trait_token, &t.ident);
            quote!(#token #ident)
        }
        Item::Impl(i) => {
            let (token, ty) = (&i.impl_token, &i.self_ty);
            quote!(#token #ty)
        }
        other => quote!(#other),
    }
}

fn require_receiver(sig: &Signature) -> Result<()> {
    if sig.receiver().is_some() {
        return Ok(());
    }
    Err(Error::new_spanned(
        sig,
        format!("{NOT_A_METHOD}; this function takes no `self`"),
    ))
}

/// A second `#[idempotent]` (written twice, or once more by a macro) would guard the call
/// again inside the first guard, which then waits on its own claim.
fn refuse_a_second_attribute(attrs: &[Attribute]) -> Result<()> {
    match attrs.iter().find(|a| last_ident_is(a.path(), "idempotent")) {
        Some(again) => Err(Error::new_spanned(
            again,
            "#[idempotent] is given twice on this method: keep one",
        )),
        None => Ok(()),
    }
}

fn shape(sig: &Signature) -> Result<Shape> {
    let ret = match &sig.output {
        ReturnType::Default => None,
        ReturnType::Type(_, ty) => Some(ty),
    };
    if sig.asyncness.is_some() {
        let Some(ret) = ret else {
            let (fn_token, ident) = (&sig.fn_token, &sig.ident);
            return Err(Error::new_spanned(
                quote!(#fn_token #ident),
                "an #[idempotent] method returns what the guard stores and replays: add \
                 `-> RpcResult<Replayable<T>>` (one answer) or `-> RpcResult<EventStream<T>>` \
                 (a stream), here and in the `#[rpc]` trait",
            ));
        };
        return Ok(Shape::Async(ret.clone()));
    }
    match ret.map(|ty| peel(ty)) {
        Some(Type::Path(path)) if last_ident_is(&path.path, "Pin") => {
            Ok(Shape::BoxedFuture(pinned_output(&path.path)))
        }
        Some(Type::Path(path)) if last_ident_is(&path.path, "BoxFuture") => Ok(Shape::BoxedFuture(
            type_args(&path.path).next().cloned().map(Box::new),
        )),
        Some(Type::ImplTrait(imp)) if imp.bounds.iter().any(is_future_bound) => {
            Ok(Shape::ImplFuture)
        }
        // Told to return a boxed future, which it does, but not a `Send` one (helper-109).
        Some(Type::Path(path)) if last_ident_is(&path.path, "LocalBoxFuture") => {
            Err(Error::new_spanned(
                path,
                "a `LocalBoxFuture` is not `Send`, and jsonrpsee runs a method's future on \
                 any thread: return a `BoxFuture<...>`, or make this an `async fn`",
            ))
        }
        _ => {
            let (fn_token, ident) = (&sig.fn_token, &sig.ident);
            Err(Error::new_spanned(
                quote!(#fn_token #ident),
                "#[idempotent] wraps the method body in a future: make this an `async fn`, \
                 here and in the `#[rpc]` trait (or return `Pin<Box<dyn Future<...>>>`, \
                 `BoxFuture<...>` or `impl Future<...>`, spelled out: the attribute sees \
                 tokens, and cannot see through a type alias of one)",
            ))
        }
    }
}

/// `X` of `Pin<Box<dyn Future<Output = X> + ...>>`: the user's own tokens where
/// `#[async_trait]` made the signature, so an error about it is shown there.
fn pinned_output(pin: &syn::Path) -> Option<Box<Type>> {
    let Some(Type::Path(boxed)) = type_args(pin).next().map(peel) else {
        return None;
    };
    let Some(Type::TraitObject(object)) = type_args(&boxed.path).next().map(peel) else {
        return None;
    };
    object.bounds.iter().find_map(|bound| match bound {
        TypeParamBound::Trait(t) if last_ident_is(&t.path, "Future") => {
            let last = t.path.segments.last()?;
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(assoc) if assoc.ident == "Output" => {
                    Some(Box::new(assoc.ty.clone()))
                }
                _ => None,
            })
        }
        _ => None,
    })
}

/// The type arguments of a path's last segment.
fn type_args(path: &syn::Path) -> impl Iterator<Item = &Type> {
    let args = path.segments.last().map(|seg| &seg.arguments);
    let args = match args {
        Some(PathArguments::AngleBracketed(args)) => Some(&args.args),
        _ => None,
    };
    args.into_iter().flatten().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

fn is_future_bound(bound: &TypeParamBound) -> bool {
    matches!(bound, TypeParamBound::Trait(t) if last_ident_is(&t.path, "Future"))
}

fn extensions_param(sig: &Signature) -> Result<Ident> {
    let param = sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(typed) if is_extensions_ref(&typed.ty) => Some(typed),
        _ => None,
    });
    let Some(param) = param else {
        if let Some(by_value) = sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Typed(typed) if is_extensions(&typed.ty) => Some(typed),
            _ => None,
        }) {
            return Err(Error::new_spanned(
                &by_value.ty,
                "#[idempotent] takes the request's `Extensions` by reference, as jsonrpsee \
                 passes them: write `&Extensions`",
            ));
        }
        return Err(Error::new_spanned(
            &sig.ident,
            "#[idempotent] needs the request's `Extensions`: add `with_extensions` to this \
             method's `#[method(...)]` and take an `ext: &Extensions` parameter (spelled \
             `Extensions`: an alias of it is not recognised)",
        ));
    };
    if matches!(peel(&param.ty), Type::Reference(r) if r.mutability.is_some()) {
        return Err(Error::new_spanned(
            &param.ty,
            "#[idempotent] reads the request's `Extensions` and hands them to the guard, as \
             jsonrpsee passes them: take them shared, `&Extensions`",
        ));
    }
    match &*param.pat {
        Pat::Ident(pat) => Ok(pat.ident.clone()),
        other => Err(Error::new_spanned(
            other,
            "name the `Extensions` parameter, e.g. `ext: &Extensions`: #[idempotent] hands it \
             to the idempotency guard",
        )),
    }
}

fn is_extensions_ref(ty: &Type) -> bool {
    matches!(peel(ty), Type::Reference(reference) if is_extensions(&reference.elem))
}

fn is_extensions(ty: &Type) -> bool {
    matches!(peel(ty), Type::Path(p) if last_ident_is(&p.path, "Extensions"))
}

/// Types that went through a `macro_rules!` arrive wrapped in invisible groups.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}

fn last_ident_is(path: &syn::Path, name: &str) -> bool {
    path.segments.last().is_some_and(|seg| seg.ident == name)
}
