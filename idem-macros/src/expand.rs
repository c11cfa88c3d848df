//! Splices the idempotency guard around a validated method's body.

use proc_macro2::{Span, TokenStream};
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
            // type the guard cannot store is reported there.
            let body = outer_spanned(typed_async_block(&ret, body), ret.span());
            outer_spanned(quote!(#guard(#ext, #body).await), ret.span())
        }
        Shape::BoxedFuture(output) => {
            // The guard runs inside an `async move` block that `Box::pin` returns, the shape
            // of `#[async_trait]`'s own bodies: `#[tracing::instrument]` under this attribute
            // recognises it and instruments the future, the guard and the body in it. A `return`
            // in a hand-written body cannot skip the guard: it would return from the block.
            let span = output.map_or_else(Span::call_site, |ty| ty.span());
            // The caller's hygiene, so that the error is shown where `span` points: the body
            // cannot see the name (it is bound after it), and `__`-names are no user's.
            let future = Ident::new("__idem_future", span);
            let call = outer_spanned(quote!(#guard(#ext, #future).await), span);
            quote!(::std::boxed::Box::pin(async move {
                let #future = { #body };
                #call
            }))
        }
        Shape::ImplFuture => quote!(#guard(#ext, { #body })),
    };
    let (attrs, vis, sig, inner) = (&func.attrs, &func.vis, &func.sig, &func.inner_attrs);
    quote!(#(#attrs)* #vis #sig { #(#inner)* #new_body })
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
/// alone would come too late for a `return` placed before it.
fn typed_async_block(ret: &Type, body: &TokenStream) -> TokenStream {
    let out = Ident::new("__idem_out", Span::mixed_site());
    quote! {
        async move {
            if let ::core::option::Option::Some(#out) = ::core::option::Option::None::<#ret> {
                #[allow(unreachable_code)]
                return #out;
            }
            let #out: #ret = { #body };
            #[allow(unreachable_code)]
            #out
        }
    }
}
