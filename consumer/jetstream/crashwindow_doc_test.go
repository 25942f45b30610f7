package jetstream_test

import (
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// The package documentation says where a crash can redo work in batches: every
// effect of a batch is confirmed together, so one crash can redo up to one
// batch, where one message at a time risks one.
func TestDocStatesBatchCrashWindow(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "jetstream.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	if !strings.Contains(doc, "A crash can redo up to one batch") && !strings.Contains(doc, "a crash can redo up to one batch") {
		t.Errorf("the documentation in jetstream.go does not say that a crash can redo up to one batch")
	}
}
