//! Splices the idempotency guard around a validated method's body.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::quote;
use syn::spanned::Spanned;
use syn::{Ident, Type};

use crate::args::Args;
use crate::method::{Method, Shape};

/// Rewrites the method so its body runs inside `KRATE::__private::guard(ext, body)`.
pub(crate) fn expand(args: &Args, method: Method) -> TokenStream {
    let Method { func, ext, shape } = method;
    let krate = &args.krate;
    let guard = quote!(#krate::__private::guard);
    let body = &func.body;
    let new_body = match shape {
        Shape::Async(ret) => {
            // Spanned on the return type, the guarded future and the guard's call alike: a
            // type the guard cannot store is reported there. The guard is imported first,
            // under the crate path's own spans: a path that does not resolve is reported
            // where it is written (it was reported on the return type: helper-92).
            let body = outer_spanned(typed_async_block(&ret, body), ret.span());
            let guard_fn = generated("__idem_guard_fn", ret.span());
            let call = outer_spanned(quote!(#guard_fn(#ext, #body).await), ret.span());
            quote! {
                use #guard as #guard_fn;
                #call
            }
        }
        Shape::BoxedFuture(output) => {
            // The body runs in a closure of the method's own return type, so that its `return`
            // and `?` are the method's, as they were. The closure runs inside the `async move`
            // block that `Box::pin` returns, the shape of `#[async_trait]`'s own bodies:
            // `#[tracing::instrument]` under this attribute recognises it, records its fields
            // before the parameters move into the block, and instruments the guard and the
            // body. The guard reads `ext` before: the block does not hold it for the guard.
            let span = output.map_or_else(Span::call_site, |ty| ty.span());
            let guard = generated("__idem_guard", span);
            // The caller's hygiene, so that an error about the future is shown where `span`
            // points (a mixed-site name is shown on the attribute): the body cannot see it, as
            // it is bound after it.
            let future = Ident::new("__idem_future", span);
            // Not the guard's name itself: its span carries its hygiene. Spanned on the
            // return type, as the async shape's are: a type the guard cannot store is
            // reported there.
            let run = outer_spanned(quote!(.run(#future).await), span);
            // A return type holding an `impl Trait` cannot be a closure's: left to inference
            // there, as in the async shape's block (it was refused, where the method compiles
            // without the attribute: helper-109).
            let ret = &func.sig.output;
            let ret = match names_impl_trait(quote!(#ret)) {
                true => TokenStream::new(),
                false => quote!(#ret),
            };
            quote! {
                let #guard = #krate::__private::Guard::of(#ext);
                ::std::boxed::Box::pin(async move {
                    let #future = #krate::__private::once(move || #ret { #body });
                    #guard #run
                })
            }
        }
        // In a closure too, for `return` and `?`; its type is the future's, which
        // `impl Future` does not name.
        Shape::ImplFuture => quote!(#guard(#ext, #krate::__private::once(move || { #body }))),
    };
    let (attrs, vis, sig, inner) = (&func.attrs, &func.vis, &func.sig, &func.inner_attrs);
    quote!(#(#attrs)* #vis #sig { #(#inner)* #new_body })
}

/// A name of the expansion's own, which no code of the user's can see or shadow, shown at
/// `at` in an error.
fn generated(name: &str, at: Span) -> Ident {
    Ident::new(name, Span::mixed_site().located_at(at))
}

/// `tokens` with their outermost tokens (not what their groups hold) spanned at `span`, so
/// that an expression made of them is reported there.
fn outer_spanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

/// An `async move` block whose output is pinned to the declared return type.
///
/// Left to inference, the block's output is taken from the first `return` or `?` in the
/// body, so a mistake there is reported on the attribute instead of on the user's code. The
/// dead `if let` fixes the type before the body is checked, as async-trait does; the `let`
/// alone would come too late for a `return` placed before it. A return type holding an
/// `impl Trait` cannot be written in either place (it was refused, where the method compiles
/// without the attribute: helper-92), so its block is left to inference. The lints are the
/// expansion's: a body that ends in `todo!()` diverges in the `let`, not in the user's code.
fn typed_async_block(ret: &Type, body: &TokenStream) -> TokenStream {
    if names_impl_trait(quote!(#ret)) {
        return quote!(async move { #body });
    }
    let out = generated("__idem_out", Span::call_site());
    quote! {
        async move {
            if let ::core::option::Option::Some(#out) = ::core::option::Option::None::<#ret> {
                #[allow(unreachable_code)]
                return #out;
            }
            #[allow(clippy::diverging_sub_expression, clippy::let_and_return)]
            let #out: #ret = { #body };
            #[allow(unreachable_code)]
            #out
        }
    }
}

/// Whether `ty` holds an `impl Trait`, at any depth.
fn names_impl_trait(ty: TokenStream) -> bool {
    ty.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => names_impl_trait(group.stream()),
        _ => false,
    })
}
