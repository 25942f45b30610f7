package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// The options every store shares are repeated in each store's flat options
// (RedisOptions, sqlstore.Options): their docs must say the same, or a
// user reading one store's options learns another contract.
func TestSharedOptionDocsAgree(t *testing.T) {
	want := fieldDocs(t, "options.go", "Options")
	for _, o := range []struct{ file, typ string }{
		{"redisstore.go", "RedisOptions"},
		{"sqlstore/sqlstore.go", "Options"},
	} {
		got := fieldDocs(t, o.file, o.typ)
		for name, doc := range want {
			d, ok := got[name]
			if !ok {
				t.Errorf("%s.%s is missing; want the shared option %s", o.typ, name, name)
				continue
			}
			if d != doc {
				t.Errorf("%s.%s (%s) is documented\n\t%q\nwant, as idem.Options.%s,\n\t%q", o.typ, name, o.file, d, name, doc)
			}
		}
	}
}

// fieldDocs returns the doc comment of each exported field of type typ in
// file.
func fieldDocs(t *testing.T, file, typ string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typ {
			return true
		}
		for _, fl := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range fl.Names {
				if name.IsExported() {
					docs[name.Name] = strings.TrimSpace(fl.Doc.Text())
				}
			}
		}
		return false
	})
	if len(docs) == 0 {
		t.Fatalf("no type %s in %s", typ, file)
	}
	return docs
}
