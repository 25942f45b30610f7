// Command callpath prints the static path of one function through the
// package that declares it, and counts the files a reader visits following
// it. It measures the code's layout; no shipped package imports it.
//
// Usage:
//
//	go run ./internal/testing/callpath [-pkg dir] [-key param] 'func'
//
// func is named as go/types writes it, without the package: 'Do',
// '(*RedisStore).Claim', 'Op.String'. -pkg is the package's directory
// (default "."); its non-test .go files that match the build constraints of
// this machine are parsed and type-checked from source.
//
// # The walk
//
// The walk starts at func and expands each call whose callee is a function
// or method declared in the package and known statically: a direct call, a
// method of a concrete type, a method expression. Calls are taken in the
// pre-order of the body's syntax tree, the order in which call expressions
// begin in the source, an outer call before the calls in its arguments;
// deferred calls, go statements and the bodies of function literals count
// where they are written. The walk is depth-first and expands a function
// once, at its first call; a later call prints "(seen)" and is not entered.
// A call through an interface or a func value is printed as a leaf, marked
// "(interface)" or "(func value)", and not followed. Calls into other
// packages, builtins and conversions are not printed. An expanded or seen
// function is printed with the file and line of its declaration, a leaf
// with those of the call.
//
// # The figures
//
// The file sequence starts with func's file; expanding a callee appends the
// callee's file, and finishing it appends the caller's file again. Equal
// neighbours are collapsed into one. "files" is the number of distinct
// files in the sequence; "climbs back" is the length of the sequence less
// "files": the number of moves into a file the walk had already been in
// and left, returns from a callee included. A callee in its caller's file
// costs nothing; a round trip to a file not yet visited costs one climb
// (the return), to a file already visited two. "calls back up" counts the
// calls (first or "(seen)") whose callee is declared in a file of a
// function further up the walk's stack, other than the caller's own: a
// layer calling back into one that called it. The tree marks each with a
// "^" after the callee's name.
//
// # Following the key
//
// With -key, the walk keeps only the calls the value of func's parameter
// named param goes through. Variables and struct fields carry it: first
// that parameter; then, in one forward pass over each walked body, the
// variable at the root of the left side of an assignment (=, :=, var,
// range) whose right side mentions a carrier, with each field selected on
// the way ("c.key[0] = key" marks c and the field key), and the field F of
// a struct literal's "F: e" when e mentions one. An expression mentions a
// carrier if it uses a carrier variable, except that a field selection x.F
// mentions one only if F carries the key. A call whose receiver or an
// argument mentions a carrier makes the matching receiver and parameters of
// the callee carriers, and the callee is expanded only if its body then
// mentions one. Leaves and "(seen)" are printed only for calls that mention
// a carrier. Fields carry the key across the whole package, so a struct
// that holds it is followed wherever it goes. The rule over-approximates (a
// value computed from the key, such as its hash or an error naming it, or
// a function literal using it, carries it too): it is meant for comparing
// the same code before and after a change, not as an exact data flow.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	dir := flag.String("pkg", ".", "directory of the package")
	key := flag.String("key", "", "follow only the calls this parameter of the function goes through")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: callpath [-pkg dir] [-key param] 'func'")
		os.Exit(2)
	}
	if err := run(os.Stdout, *dir, flag.Arg(0), *key); err != nil {
		fmt.Fprintln(os.Stderr, "callpath:", err)
		os.Exit(1)
	}
}

type walker struct {
	fset     *token.FileSet
	info     *types.Info
	decls    map[*types.Func]*ast.FuncDecl
	seen     map[*types.Func]bool
	keyed    bool
	carriers map[types.Object]bool // variables and fields carrying the key
	tree     strings.Builder
	files    []string // the collapsed file sequence
	stack    []string // the files of the functions being expanded, outermost first
	ups      int      // calls back up: into a file further up the stack
	up       bool     // the function expand prints next is such a call
}

// run loads the package in dir and writes the walk from the function named
// fn: the tree, the file sequence and the two figures.
func run(out io.Writer, dir, fn, key string) error {
	w, err := load(dir)
	if err != nil {
		return err
	}
	var root *types.Func
	for f := range w.decls {
		if funcName(f) == fn {
			if root != nil {
				return fmt.Errorf("%s is declared more than once in %s", fn, dir)
			}
			root = f
		}
	}
	if root == nil {
		return fmt.Errorf("no function %s declared in %s", fn, dir)
	}
	if key != "" {
		ps := root.Signature().Params()
		for i := range ps.Len() {
			if ps.At(i).Name() == key {
				w.carriers[ps.At(i)] = true
			}
		}
		if len(w.carriers) == 0 {
			return fmt.Errorf("%s has no parameter %s", fn, key)
		}
		w.keyed = true
	}
	w.expand(root, 0)
	distinct := map[string]bool{}
	for _, f := range w.files {
		distinct[f] = true
	}
	_, err = fmt.Fprintf(out, "%s\npath: %s\nfiles: %d\nclimbs back: %d\ncalls back up: %d\n", w.tree.String(),
		strings.Join(w.files, " > "), len(distinct), len(w.files)-len(distinct), w.ups)
	return err
}

// load parses and type-checks the package in dir.
func load(dir string) (*walker, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(abs)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if ok, err := build.Default.MatchFile(abs, name); err != nil || !ok {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(abs, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no Go files in %s", dir)
	}
	info := &types.Info{
		Types:      map[ast.Expr]types.TypeAndValue{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
		Selections: map[*ast.SelectorExpr]*types.Selection{},
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check(files[0].Name.Name, fset, files, info); err != nil {
		return nil, err
	}
	w := &walker{fset: fset, info: info, decls: map[*types.Func]*ast.FuncDecl{},
		seen: map[*types.Func]bool{}, carriers: map[types.Object]bool{}}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				w.decls[info.Defs[fd.Name].(*types.Func)] = fd
			}
		}
	}
	return w, nil
}

// funcName writes f as go/types does, without the package: F, T.M, (*T).M.
func funcName(f *types.Func) string {
	recv := f.Signature().Recv()
	if recv == nil {
		return f.Name()
	}
	t := types.TypeString(recv.Type(), func(*types.Package) string { return "" })
	if strings.HasPrefix(t, "*") {
		t = "(" + t + ")"
	}
	return t + "." + f.Name()
}

func (w *walker) print(depth int, name string, at token.Pos) {
	pos := w.fset.Position(at)
	fmt.Fprintf(&w.tree, "%s%s  %s:%d\n", strings.Repeat("  ", depth), name, filepath.Base(pos.Filename), pos.Line)
}

func (w *walker) step(file string) {
	if n := len(w.files); n == 0 || w.files[n-1] != file {
		w.files = append(w.files, file)
	}
}

// expand prints fn, enters its file and walks its body.
func (w *walker) expand(fn *types.Func, depth int) {
	decl := w.decls[fn]
	w.seen[fn] = true
	name := funcName(fn)
	if w.up {
		name, w.up = name+" ^", false
	}
	w.print(depth, name, decl.Name.Pos())
	file := w.file(fn)
	w.step(file)
	w.stack = append(w.stack, file)
	defer func() { w.stack = w.stack[:len(w.stack)-1] }()
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				w.carry(lhs, n.Rhs[min(i, len(n.Rhs)-1)])
			}
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if len(n.Values) > 0 {
					w.carry(name, n.Values[min(i, len(n.Values)-1)])
				}
			}
		case *ast.RangeStmt:
			for _, v := range []ast.Expr{n.Key, n.Value} {
				if v != nil {
					w.carry(v, n.X)
				}
			}
		case *ast.KeyValueExpr: // F: e in a struct literal
			if f, ok := w.info.Uses[ident(n.Key)].(*types.Var); ok && f.IsField() && w.mentions(n.Value) {
				w.carriers[f] = true
			}
		case *ast.CallExpr:
			w.call(n, depth+1, file)
		}
		return true
	})
}

// file is the base name of the file declaring fn.
func (w *walker) file(fn *types.Func) string {
	return filepath.Base(w.fset.Position(w.decls[fn].Pos()).Filename)
}

// upCall counts and reports a call from file into a file further up the
// stack: a lower layer calling back into one above it.
func (w *walker) upCall(file string, callee *types.Func) bool {
	to := w.file(callee)
	if to == file || !slices.Contains(w.stack, to) {
		return false
	}
	w.ups++
	return true
}

func ident(e ast.Expr) *ast.Ident { id, _ := e.(*ast.Ident); return id }

// carry marks the root variable of lhs, and the fields selected on the way
// to it, if rhs mentions a carrier.
func (w *walker) carry(lhs, rhs ast.Expr) {
	if !w.keyed || !w.mentions(rhs) {
		return
	}
	for {
		switch e := ast.Unparen(lhs).(type) {
		case *ast.SelectorExpr:
			if sel := w.info.Selections[e]; sel != nil && sel.Kind() == types.FieldVal {
				w.carriers[sel.Obj()] = true
			}
			lhs = e.X
		case *ast.IndexExpr:
			lhs = e.X
		case *ast.StarExpr:
			lhs = e.X
		case *ast.Ident:
			if obj := w.info.ObjectOf(e); obj != nil {
				w.carriers[obj] = true
			}
			return
		default:
			return
		}
	}
}

// mentions reports whether n uses a carrier; a field selection x.F uses
// one only if F is a carrier.
func (w *walker) mentions(n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		switch e := n.(type) {
		case *ast.Ident:
			found = found || w.carriers[w.info.Uses[e]]
		case *ast.SelectorExpr:
			if sel := w.info.Selections[e]; sel != nil && sel.Kind() == types.FieldVal {
				found = found || w.carriers[sel.Obj()]
				return false
			}
		}
		return !found
	})
	return found
}

// call prints the call c, made from a function in file, and expands its
// callee if the package declares it and the walk has not been there.
func (w *walker) call(c *ast.CallExpr, depth int, file string) {
	fun := ast.Unparen(c.Fun)
	if w.info.Types[fun].IsType() {
		return // a conversion
	}
	if e, ok := fun.(*ast.IndexExpr); ok { // an instantiation: F[T](...)
		fun = e.X
	} else if e, ok := fun.(*ast.IndexListExpr); ok {
		fun = e.X
	}
	var callee *types.Func
	recv, args, leaf := ast.Expr(nil), c.Args, "func value"
	name := ident(fun) // F, or Name in pkg.Name
	switch e := fun.(type) {
	case *ast.FuncLit:
		return // its body is walked where it is written
	case *ast.SelectorExpr:
		switch sel := w.info.Selections[e]; {
		case sel == nil:
			name = e.Sel
		case sel.Kind() == types.FieldVal:
		case types.IsInterface(sel.Recv()):
			leaf = "interface"
		case sel.Kind() == types.MethodVal:
			callee, recv = sel.Obj().(*types.Func), e.X
		default: // a method expression: T.M(recv, args...)
			callee, recv, args = sel.Obj().(*types.Func), args[0], args[1:]
		}
	}
	switch obj := w.info.Uses[name].(type) {
	case *types.Builtin:
		return
	case *types.Func:
		callee = obj
	}
	if callee != nil {
		if callee = callee.Origin(); w.decls[callee] == nil {
			return // declared in another package
		}
	}
	switch {
	case callee == nil:
		if !w.keyed || w.mentions(c) {
			w.print(depth, types.ExprString(fun)+" ("+leaf+")", c.Lparen)
		}
	case w.seen[callee]:
		if !w.keyed || w.mentions(c) {
			up := ""
			if w.upCall(file, callee) {
				up = " ^"
			}
			w.print(depth, funcName(callee)+" (seen)"+up, w.decls[callee].Name.Pos())
		}
	case !w.keyed || w.pass(callee, recv, args):
		w.up = w.upCall(file, callee)
		w.expand(callee, depth)
		w.step(file)
	}
}

// pass makes carriers of callee's receiver and parameters whose argument
// mentions one, and reports whether its body then mentions one; if not,
// it takes them back.
func (w *walker) pass(callee *types.Func, recv ast.Expr, args []ast.Expr) bool {
	sig := callee.Signature()
	var marked []types.Object
	mark := func(v *types.Var) {
		if !w.carriers[v] {
			w.carriers[v] = true
			marked = append(marked, v)
		}
	}
	if recv != nil && w.mentions(recv) {
		mark(sig.Recv())
	}
	ps := sig.Params()
	for i, a := range args {
		switch {
		case !w.mentions(a):
		case len(args) == 1 && ps.Len() > 1: // f(g()) spreads g's results
			for j := range ps.Len() {
				mark(ps.At(j))
			}
		case i < ps.Len():
			mark(ps.At(i))
		case sig.Variadic():
			mark(ps.At(ps.Len() - 1))
		}
	}
	if len(marked) > 0 && w.mentions(w.decls[callee].Body) {
		return true
	}
	for _, v := range marked {
		delete(w.carriers, v)
	}
	return false
}
