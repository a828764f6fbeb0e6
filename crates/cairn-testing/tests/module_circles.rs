//! No module circles: inside every crate of the workspace, the top-level
//! modules import one another without a loop, so that each crate reads as
//! floors, every module standing above what it uses.
//!
//! Every source file reached from a crate root (`src/lib.rs`, `src/main.rs`)
//! through its `mod` declarations is parsed with `syn`. An arrow A -> B is
//! drawn when code in top-level module A (any file or inline module under
//! it, tests included) names top-level module B: a `use` tree (groups and
//! renames unfolded: `use crate::{a, b::c}` is two arrows), any path in
//! code, types or patterns (`crate::b::f()`, `super::super::b::T`), or a
//! `crate::`/`$crate::`/`super::`/`self::` path inside a macro's tokens. A
//! name that the crate root re-exports (`crate::Volume` from `pub use
//! volume::Volume`) counts as its home module. Doc comments are not code.
//!
//! The crate root itself is the crate's face, no floor: it declares and
//! re-exports the modules and may hold the crate's central trait, which
//! its modules implement (`cairn_backend::Backend`), so arrows to and from
//! its own items are not drawn. Vendored crates (`third_party/`) are not
//! ours to arrange. Crates themselves cannot import one another in a loop:
//! cargo refuses it.
//!
//! `CAIRN_MODULE_FLOORS=1 cargo test --release -p cairn-testing --test
//! module_circles -- --nocapture` prints every crate's modules floor by
//! floor.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

#[test]
fn no_crate_of_the_workspace_has_a_module_circle() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let manifest = std::fs::read_to_string(top.join("Cargo.toml")).unwrap();
    let manifest: toml::Table = manifest.parse().unwrap();
    let members = manifest["workspace"]["members"].as_array().expect("workspace.members");
    let mut report = String::new();
    let mut roots = 0;
    for member in members {
        let member = member.as_str().unwrap();
        if member.starts_with("third_party/") {
            continue;
        }
        for root in ["src/lib.rs", "src/main.rs"] {
            let file = top.join(member).join(root);
            if !file.exists() {
                continue;
            }
            roots += 1;
            let graph = Graph::of_crate(&top, &file).unwrap_or_else(|e| panic!("{e}"));
            if std::env::var_os("CAIRN_MODULE_FLOORS").is_some() {
                println!("{member} ({root}):\n{}", graph.floors());
            }
            for circle in graph.circles() {
                writeln!(report, "{member} ({root}): {}", graph.describe(&circle)).unwrap();
            }
        }
    }
    assert!(roots >= 10, "found only {roots} crate roots under {}", top.display());
    assert!(report.is_empty(), "module import circles (break each by moving what both sides share into a module below them):\n{report}");
}

/// One crate's top-level modules and the arrows between them, each arrow
/// with the places that draw it (file:line and the path as written).
#[derive(Default)]
struct Graph {
    nodes: BTreeSet<String>,
    arrows: BTreeMap<(String, String), Vec<String>>,
}

/// What the crate root says about the names it holds.
#[derive(Default)]
struct Root {
    /// Top-level modules.
    modules: BTreeSet<String>,
    /// Names the root imports or re-exports, and the top-level module they come from.
    imported: HashMap<String, String>,
    /// Modules whose names the root takes in whole (`pub use types::*`).
    globs: Vec<String>,
}

/// One parsed source file and where it stands in the module tree.
struct Source {
    shown: String,
    module: Vec<String>,
    ast: syn::File,
}

impl Graph {
    /// Reads the crate whose root file is `root_file`, following `mod`
    /// declarations to their files.
    fn of_crate(top: &Path, root_file: &Path) -> Result<Graph, String> {
        let mut sources = Vec::new();
        load(top, root_file, Vec::new(), &mut sources)?;
        Ok(Graph::of_sources(&sources))
    }

    fn of_sources(sources: &[Source]) -> Graph {
        let root = Root::of(&sources[0].ast, sources);
        let mut g = Graph::default();
        g.nodes.extend(root.modules.iter().cloned());
        for src in sources {
            let mut v = Walker { root: &root, src, module: src.module.clone(), found: Vec::new() };
            if src.module.is_empty() {
                // The root is no node: only its inline modules (`mod x { .. }`)
                // are top-level modules to walk.
                for item in &src.ast.items {
                    if let syn::Item::Mod(m) = item {
                        v.visit_item_mod(m);
                    }
                }
            } else {
                v.visit_file(&src.ast);
            }
            for (from, to, place) in v.found {
                if from != to {
                    g.nodes.insert(from.clone());
                    g.nodes.insert(to.clone());
                    g.arrows.entry((from, to)).or_default().push(place);
                }
            }
        }
        g
    }

    fn next<'a>(&'a self, n: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.arrows.keys().filter(move |(a, _)| a == n).map(|(_, b)| b)
    }

    /// The modules floor by floor, the top first: each stands above all it
    /// imports (floor 1 imports none of the others); modules in a circle
    /// stand on no floor.
    fn floors(&self) -> String {
        let mut placed: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::new();
        loop {
            let floor: Vec<&str> = self.nodes.iter().map(String::as_str).filter(|n| !placed.contains_key(n) && self.next(n).all(|m| placed.contains_key(m.as_str()))).collect();
            if floor.is_empty() {
                break;
            }
            for n in &floor {
                placed.insert(n, out.len() + 1);
            }
            out.push(floor);
        }
        let mut s = String::new();
        for (i, floor) in out.iter().enumerate().rev() {
            let shown: Vec<String> = floor.iter().map(|n| {
                let mut to: Vec<&str> = self.next(n).map(String::as_str).collect();
                to.sort();
                if to.is_empty() { n.to_string() } else { format!("{n} -> {}", to.join(" ")) }
            }).collect();
            writeln!(s, "  floor {}: {}", i + 1, shown.join("; ")).unwrap();
        }
        let left: Vec<&str> = self.nodes.iter().map(String::as_str).filter(|n| !placed.contains_key(n)).collect();
        if !left.is_empty() {
            writeln!(s, "  in or above a circle: {}", left.join(", ")).unwrap();
        }
        s
    }

    /// The strongly connected parts of more than one node (Tarjan), each
    /// given as one loop through all of its nodes' part: a shortest way
    /// round from its first node.
    fn circles(&self) -> Vec<Vec<String>> {
        struct T<'a> {
            g: &'a Graph,
            index: HashMap<&'a str, usize>,
            low: HashMap<&'a str, usize>,
            stack: Vec<&'a str>,
            on: BTreeSet<&'a str>,
            parts: Vec<Vec<String>>,
        }
        fn strong<'a>(t: &mut T<'a>, n: &'a str) {
            let i = t.index.len();
            t.index.insert(n, i);
            t.low.insert(n, i);
            t.stack.push(n);
            t.on.insert(n);
            for m in t.g.next(n) {
                if !t.index.contains_key(m.as_str()) {
                    strong(t, m);
                    let l = t.low[m.as_str()].min(t.low[n]);
                    t.low.insert(n, l);
                } else if t.on.contains(m.as_str()) {
                    let l = t.index[m.as_str()].min(t.low[n]);
                    t.low.insert(n, l);
                }
            }
            if t.low[n] == t.index[n] {
                let mut part = Vec::new();
                loop {
                    let m = t.stack.pop().unwrap();
                    t.on.remove(m);
                    part.push(m.to_string());
                    if m == n {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    t.parts.push(part);
                }
            }
        }
        let mut t = T { g: self, index: HashMap::new(), low: HashMap::new(), stack: Vec::new(), on: BTreeSet::new(), parts: Vec::new() };
        for n in &self.nodes {
            if !t.index.contains_key(n.as_str()) {
                strong(&mut t, n);
            }
        }
        let mut parts = t.parts;
        parts.sort();
        parts
    }

    /// A strongly connected part as one loop through it, "a -> b -> a",
    /// with the places that draw each arrow of the loop.
    fn describe(&self, part: &[String]) -> String {
        let inside: BTreeSet<&str> = part.iter().map(String::as_str).collect();
        // A shortest loop from the first node, by breadth-first search.
        let start = part[0].as_str();
        let mut came: HashMap<&str, &str> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(n) = queue.pop_front() {
            for m in self.next(n).map(String::as_str).filter(|m| inside.contains(m)) {
                if m == start {
                    last = Some(n);
                    break 'search;
                }
                if !came.contains_key(m) {
                    came.insert(m, n);
                    queue.push_back(m);
                }
            }
        }
        let mut ring = Vec::new();
        let mut n = last.expect("a strongly connected part has a loop");
        while n != start {
            ring.push(n);
            n = came[n];
        }
        ring.push(start);
        ring.reverse();
        ring.push(start);
        let mut s = format!("{} modules in a circle ({}); one loop: {}", part.len(), part.join(", "), ring.join(" -> "));
        for pair in ring.windows(2) {
            let places = &self.arrows[&(pair[0].to_string(), pair[1].to_string())];
            let more = if places.len() > 3 { format!(" and {} more", places.len() - 3) } else { String::new() };
            write!(s, "\n    {} -> {}: {}{more}", pair[0], pair[1], places[..places.len().min(3)].join(", ")).unwrap();
        }
        let among = self.arrows.keys().filter(|(a, b)| inside.contains(a.as_str()) && inside.contains(b.as_str())).count();
        if among > ring.len() - 1 {
            write!(s, "\n    (and {} more arrows among these modules)", among - (ring.len() - 1)).unwrap();
        }
        s
    }
}

/// Parses `file` (module path `module`) and, through its `mod x;` lines,
/// every file below it.
fn load(top: &Path, file: &Path, module: Vec<String>, out: &mut Vec<Source>) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let ast = syn::parse_file(&text).map_err(|e| format!("parsing {}: {e}", file.display()))?;
    // The folder that a `mod x;` here looks in: the file's own folder for a
    // crate root or a mod.rs, else a folder named after the file.
    let name = file.file_name().unwrap().to_str().unwrap();
    let dir = if module.is_empty() || name == "mod.rs" { file.parent().unwrap().to_path_buf() } else { file.with_extension("") };
    let mut children = Vec::new();
    collect_mods(&ast.items, &dir, &module, file, &mut children)?;
    let shown = file.strip_prefix(top).unwrap_or(file).display().to_string();
    out.push(Source { shown, module, ast });
    for (child, module) in children {
        load(top, &child, module, out)?;
    }
    Ok(())
}

/// The files of the `mod x;` declarations in `items` (inline modules
/// looked into: their `mod y;` lives in `dir/x/y.rs`).
fn collect_mods(items: &[syn::Item], dir: &Path, module: &[String], file: &Path, out: &mut Vec<(PathBuf, Vec<String>)>) -> Result<(), String> {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if m.attrs.iter().any(|a| a.path().is_ident("path")) {
            return Err(format!("{}: #[path] on mod {} is not understood by this check", file.display(), m.ident));
        }
        let mut child = module.to_vec();
        child.push(m.ident.to_string());
        match &m.content {
            Some((_, inner)) => collect_mods(inner, &dir.join(m.ident.to_string()), &child, file, out)?,
            None => {
                let flat = dir.join(format!("{}.rs", m.ident));
                let folder = dir.join(m.ident.to_string()).join("mod.rs");
                let found = if flat.exists() {
                    flat
                } else if folder.exists() {
                    folder
                } else {
                    return Err(format!("{}: mod {} has neither {} nor {}", file.display(), m.ident, flat.display(), folder.display()));
                };
                out.push((found, child));
            }
        }
    }
    Ok(())
}

impl Root {
    fn of(ast: &syn::File, sources: &[Source]) -> Root {
        let mut r = Root::default();
        for item in &ast.items {
            match item {
                syn::Item::Mod(m) => {
                    r.modules.insert(m.ident.to_string());
                }
                syn::Item::Use(u) => {
                    let mut leaves = Vec::new();
                    use_leaves(&u.tree, Vec::new(), &mut leaves);
                    for (path, name) in leaves {
                        let first = match path.first().map(String::as_str) {
                            Some("crate" | "self") => path.get(1),
                            _ => path.first(),
                        };
                        let Some(first) = first else { continue };
                        match name {
                            Some(name) => {
                                r.imported.insert(name, first.clone());
                            }
                            None => r.globs.push(first.clone()),
                        }
                    }
                }
                _ => {}
            }
        }
        // Only names that come from the crate's own modules lead to one.
        let modules = r.modules.clone();
        r.imported.retain(|_, m| modules.contains(m));
        r.globs.retain(|m| modules.contains(m));
        // A name that a glob re-export brings: from the module whose top
        // file defines it.
        for g in r.globs.clone() {
            for src in sources.iter().filter(|s| s.module.len() == 1 && s.module[0] == g) {
                for name in src.ast.items.iter().filter_map(item_name) {
                    r.imported.entry(name).or_insert_with(|| g.clone());
                }
            }
        }
        // `#[macro_export]` macros live at the root, wherever written.
        for src in sources.iter().filter(|s| !s.module.is_empty()) {
            for item in &src.ast.items {
                if let syn::Item::Macro(m) = item {
                    if m.attrs.iter().any(|a| a.path().is_ident("macro_export")) {
                        if let Some(ident) = &m.ident {
                            r.imported.insert(ident.to_string(), src.module[0].clone());
                        }
                    }
                }
            }
        }
        r
    }

    /// The top-level module that an absolute path (below the crate root)
    /// belongs to: None for the root's own items and for names it takes
    /// from other crates.
    fn node_of(&self, abs: &[String]) -> Option<String> {
        let first = abs.first()?;
        if self.modules.contains(first) {
            return Some(first.clone());
        }
        self.imported.get(first).cloned()
    }
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The leaves of a use tree: each full path, and the name it binds (None
/// for a glob; `self` in a group binds its prefix's last segment).
fn use_leaves(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push((prefix, name));
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix;
            path.push(n.ident.to_string());
            out.push((path, Some(n.ident.to_string())));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_leaves(t, prefix.clone(), out);
            }
        }
    }
}

/// Walks one file, noting every path that reaches another top-level module.
struct Walker<'a> {
    root: &'a Root,
    src: &'a Source,
    /// The module being walked (inline modules pushed).
    module: Vec<String>,
    found: Vec<(String, String, String)>,
}

impl Walker<'_> {
    fn from(&self) -> String {
        self.module.first().cloned().expect("the root's own code is not walked")
    }

    /// Notes the path `segs` written at `line`.
    fn note(&mut self, segs: &[String], line: usize) {
        let Some(abs) = self.absolute(segs) else { return };
        let Some(to) = self.root.node_of(&abs) else { return };
        let place = format!("{}:{line} {}", self.src.shown, segs.join("::"));
        self.found.push((self.from(), to, place));
    }

    /// The path below the crate root that `segs` names, if it names one.
    fn absolute(&self, segs: &[String]) -> Option<Vec<String>> {
        let first = segs.first()?;
        match first.as_str() {
            "crate" | "$crate" => Some(segs[1..].to_vec()),
            "self" => Some(self.module.iter().chain(&segs[1..]).cloned().collect()),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                let keep = self.module.len().checked_sub(ups)?;
                Some(self.module[..keep].iter().chain(&segs[ups..]).cloned().collect())
            }
            _ => None,
        }
    }

    /// `crate::a::b`, `$crate::a`, `super::a`, `self::a` in a macro's tokens.
    fn scan(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            if let TokenTree::Group(g) = &tts[i] {
                self.scan(g.stream());
                i += 1;
                continue;
            }
            let dollar = matches!(&tts[i], TokenTree::Punct(p) if p.as_char() == '$');
            let at = if dollar { i + 1 } else { i };
            // A path starts at `crate`, `$crate`, `super` or `self`, not in
            // the middle of another path.
            let start = match tts.get(at) {
                Some(TokenTree::Ident(id)) if !preceded_by_colons(&tts, at) => {
                    let id = id.to_string();
                    (id == "crate" || (!dollar && (id == "super" || id == "self"))).then_some(id)
                }
                _ => None,
            };
            let Some(start) = start else {
                i += 1;
                continue;
            };
            let line = tts[at].span().start().line;
            let mut segs = vec![start];
            let mut j = at + 1;
            while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(id))) = (tts.get(j), tts.get(j + 1), tts.get(j + 2)) {
                if a.as_char() != ':' || b.as_char() != ':' {
                    break;
                }
                segs.push(id.to_string());
                j += 3;
            }
            if segs.len() > 1 {
                self.note(&segs, line);
            }
            i = j.max(i + 1);
        }
    }
}

fn preceded_by_colons(tts: &[TokenTree], at: usize) -> bool {
    at >= 1 && matches!(&tts[at - 1], TokenTree::Punct(p) if p.as_char() == ':')
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        use_leaves(&u.tree, Vec::new(), &mut leaves);
        let line = u.use_token.span.start().line;
        for (path, _) in leaves {
            self.note(&path, line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
        if p.leading_colon.is_none() {
            self.note(&segs, line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.scan(m.tokens.clone());
    }
}

/// The graph of a crate made of `files` (paths under src/, the first the root).
fn graph_of(files: &[(&str, &str)]) -> Graph {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    Graph::of_crate(dir.path(), &dir.path().join("src").join(files[0].0)).unwrap_or_else(|e| panic!("{e}"))
}

fn arrows(g: &Graph) -> Vec<String> {
    g.arrows.keys().map(|(a, b)| format!("{a}->{b}")).collect()
}

#[test]
fn use_groups_renames_reexports_and_super_paths_are_arrows() {
    let g = graph_of(&[
        ("lib.rs", "mod a;\nmod b;\nmod c { pub fn h() {} }\nmod d;\npub use b::Thing;\n"),
        ("a.rs", "use crate::{c, d::{self as dee}, Thing as T};\npub fn g() {}\n"),
        ("b/mod.rs", "mod inner;\npub struct Thing;\n"),
        ("b/inner.rs", "fn f() { super::super::a::g(); super::Thing; }\n"),
        ("d.rs", "pub(super) fn x() {}\n"),
    ]);
    assert_eq!(arrows(&g), ["a->b", "a->c", "a->d", "b->a"]);
    let circles = g.circles();
    assert_eq!(circles, [vec!["a".to_string(), "b".to_string()]]);
    let said = g.describe(&circles[0]);
    assert!(said.starts_with("2 modules in a circle (a, b); one loop: a -> b -> a"), "{said}");
    assert!(said.contains("b -> a: src/b/inner.rs:1 super::super::a::g"), "{said}");
    assert!(said.contains("a -> b: src/a.rs:1 crate::Thing"), "{said}");
}

#[test]
fn paths_inside_macros_are_arrows_and_the_roots_own_items_are_not() {
    let g = graph_of(&[
        ("lib.rs", "mod a;\nmod b;\npub trait Store {}\npub fn run() { a::go() }\n"),
        ("a.rs", "pub fn go() { println!(\"{}\", crate::b::N); }\nimpl crate::Store for u8 {}\n/// Not code: [`crate::b::Other`].\npub struct S;\n"),
        ("b.rs", "pub const N: u8 = 1;\nmacro_rules! m { () => { $crate::a::go() } }\n"),
    ]);
    assert_eq!(arrows(&g), ["a->b", "b->a"]);
    let g = graph_of(&[("main.rs", "mod a;\npub trait Store {}\nfn main() { a::go() }\n"), ("a.rs", "pub fn go() {}\nimpl crate::Store for u8 {}\n")]);
    assert!(g.arrows.is_empty() && g.circles().is_empty());
}

#[test]
fn a_crate_in_floors_has_no_circle() {
    let g = graph_of(&[
        ("lib.rs", "mod low;\nmod mid;\nmod high;\npub use low::*;\npub use high::Top;\n"),
        ("low.rs", "pub struct Base;\n#[cfg(test)]\nmod tests { use super::*; }\n"),
        ("mid.rs", "use crate::Base;\npub struct Mid(pub Base);\n"),
        ("high.rs", "pub struct Top(crate::mid::Mid);\nfn f() { let _ = std::mem::size_of::<self::Top>(); }\n"),
    ]);
    assert_eq!(arrows(&g), ["high->mid", "mid->low"]);
    assert!(g.circles().is_empty());
}

/// The engine names no metadata store: it opens one through
/// `cairn_meta::open` and `cairn_meta::create`, which choose the store by
/// where the metadata lives, and uses it through the traits alone.
#[test]
fn the_engine_names_no_metadata_store() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let mut sources = Vec::new();
    load(&top, &top.join("crates/cairn-engine/src/lib.rs"), Vec::new(), &mut sources).unwrap_or_else(|e| panic!("{e}"));
    assert!(sources.len() > 20, "read only {} files of the engine", sources.len());
    let mut found = Vec::new();
    for src in &sources {
        let mut v = StoreNames { src, found: &mut found };
        v.visit_file(&src.ast);
    }
    assert!(found.is_empty(), "the engine names a concrete metadata store (open it with cairn_meta::open, use it through MetaStore):\n    {}", found.join("\n    "));
}

/// Notes every path that names a concrete store: its module
/// (`cairn_meta::sqlite`, `cairn_meta::postgres`) or its type.
struct StoreNames<'a> {
    src: &'a Source,
    found: &'a mut Vec<String>,
}

impl StoreNames<'_> {
    fn note(&mut self, segs: &[String], line: usize) {
        let module = segs.windows(2).any(|w| w[0] == "cairn_meta" && (w[1] == "sqlite" || w[1] == "postgres"));
        let store = segs.iter().any(|s| matches!(s.as_str(), "SqliteMeta" | "PgMeta" | "PgOptions"));
        if module || store {
            self.found.push(format!("{}:{line} {}", self.src.shown, segs.join("::")));
        }
    }
}

impl<'ast> Visit<'ast> for StoreNames<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        use_leaves(&u.tree, Vec::new(), &mut leaves);
        for (path, _) in leaves {
            self.note(&path, u.use_token.span.start().line);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segs, p.segments.first().map_or(0, |s| s.ident.span().start().line));
        syn::visit::visit_path(self, p);
    }
}
