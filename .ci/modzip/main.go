// Command modzip publishes one module of this repository into a directory
// laid out as a module proxy (GOPROXY=file://DIR), as a release would:
// the module's zip made by golang.org/x/mod/zip (the go command's own
// rules for what a module zip holds), its go.mod, its .info and its
// version in @v/list. .ci/publish-check.sh calls it once per module.
//
//	modzip -dir consumer/kafka -path github.com/idemgo/idem/consumer/kafka -version v1.2.3 -proxy /tmp/proxy
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	dir := flag.String("dir", "", "the module's directory (where its go.mod is)")
	path := flag.String("path", "", "the module path")
	version := flag.String("version", "", "the version to publish it as")
	proxy := flag.String("proxy", "", "the proxy directory to write into")
	flag.Parse()
	if *dir == "" || *path == "" || *version == "" || *proxy == "" {
		log.Fatal("modzip: -dir, -path, -version and -proxy are all required")
	}
	if err := publish(*dir, module.Version{Path: *path, Version: *version}, *proxy); err != nil {
		log.Fatalf("modzip: %s@%s: %v", *path, *version, err)
	}
}

func publish(dir string, m module.Version, proxy string) error {
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	at := filepath.Join(proxy, esc, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(at, m.Version+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, m, dir); err != nil {
		z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, m.Version+".mod"), mod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(at, m.Version+".info"), info, 0o644); err != nil {
		return err
	}
	list, err := os.OpenFile(filepath.Join(at, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(list, m.Version); err != nil {
		list.Close()
		return err
	}
	return list.Close()
}
