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
            // Spanned on the return type: a type the guard cannot store is reported there.
            let guard = respanned(guard.clone(), ret.span());
            let body = typed_async_block(&ret, body);
            quote!(#guard(#ext, #body).await)
        }
        Shape::BoxedFuture => quote!(::std::boxed::Box::pin(#guard(#ext, { #body }))),
        Shape::ImplFuture => quote!(#guard(#ext, { #body })),
    };
    let (attrs, vis, sig) = (&func.attrs, &func.vis, &func.sig);
    quote!(#(#attrs)* #vis #sig { #new_body })
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

/// `tokens`, every one of them spanned at `span`.
fn respanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            }
            token.set_span(span);
            token
        })
        .collect()
}
