// Command uiassets writes out the built Jaeger UI that
// github.com/tonistiigi/jaeger-ui-rest embeds, as plain files for Jaeger's
// own query extension to serve (extensions.jaeger_query.ui.assets_path in
// deploy/compose/jaeger.yaml).
//
// Why: a Jaeger built from its Go module serves a placeholder page, because
// jaeger-ui is built with npm and its output is not in the module.
// jaeger-ui-rest (MIT, a dependency of docker buildx) carries that output,
// gzipped, behind jaegerui.FS, which gunzips on open. Jaeger's static handler
// then does what a single-page app needs: /static/* from the folder, every
// other path (/trace/<id>, /search) gets index.html with Jaeger's version,
// storage capabilities and base path injected. No server of ours sits in
// front of Jaeger.
//
//	uiassets -tar bin/static/jaeger-ui.tar   # ADDed (unpacked) by the image
//	uiassets -dir bin/jaeger-ui              # for a Jaeger run outside docker
//
// It refuses to write anything when index.html lacks a pattern Jaeger
// v1.75's static handler replaces, or names an asset that is not there: a new
// jaeger-ui-rest that changed either would otherwise give a UI that silently
// ignores Jaeger's configuration, or a blank page.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	jaegerui "github.com/tonistiigi/jaeger-ui-rest"
)

// Bounds on what the module may hold: jaeger-ui 1.68 is 5 files, 1.5 MB. A
// module far beyond them is not the one this program was written against.
const (
	maxFiles = 64
	maxBytes = 64 << 20
)

// The strings Jaeger v1.75's cmd/query/app/static_handler.go looks for in
// index.html (its configPattern, versionPattern, compabilityPattern,
// configJsPattern and basePathPattern).
var jaegerPatterns = []string{
	"JAEGER_CONFIG = DEFAULT_CONFIG;",
	"JAEGER_VERSION = DEFAULT_VERSION;",
	"JAEGER_STORAGE_CAPABILITIES = DEFAULT_STORAGE_CAPABILITIES;",
	"// JAEGER_CONFIG_JS",
	`<base href="/"`,
}

// assetTag and assetRef find the page's own assets: <script src="./static/...">
// and <link href="./static/...">. Tags marked nomodule are skipped: they load
// vite's legacy bundles, for browsers without JavaScript modules, which
// jaeger-ui-rest leaves out.
var (
	assetTag = regexp.MustCompile(`<(?:script|link)\b[^>]*>`)
	assetRef = regexp.MustCompile(`\s(?:src|href)="\./(static/[^"]+)"`)
)

// mtime of every tar entry: the jaeger-ui-rest commit the module proxy
// serves (v0.0.0-20250408171107-...), so the archive is the same bytes on
// every build and docker's layer cache holds.
var mtime = time.Date(2025, 4, 8, 17, 11, 7, 0, time.UTC)

type file struct {
	name string // slash-separated, relative: "index.html", "static/index-....js"
	data []byte
}

func main() {
	tarPath := flag.String("tar", "", "write the assets as a tar archive (entries relative to the assets folder) to this `file`")
	dir := flag.String("dir", "", "write the assets into this `directory` (created; existing files are replaced)")
	flag.Parse()
	if *tarPath == "" && *dir == "" {
		fmt.Fprintln(os.Stderr, "uiassets: give -tar FILE and/or -dir DIR")
		os.Exit(2)
	}
	files, err := load(jaegerui.FS(jaegerui.Config{}))
	if err == nil {
		err = restoreIndex(files)
	}
	if err == nil && *tarPath != "" {
		err = writeTar(*tarPath, files)
	}
	if err == nil && *dir != "" {
		err = writeDir(*dir, files)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "uiassets:", err)
		os.Exit(1)
	}
}

// load reads every file under fsys's root, gunzipped by jaegerui.FS, in
// name order.
func load(fsys http.FileSystem) ([]file, error) {
	var files []file
	total := 0
	var walk func(dir string) error
	walk = func(dir string) error {
		d, err := fsys.Open(dir)
		if err != nil {
			return err
		}
		entries, err := d.Readdir(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			name := path.Join(dir, e.Name())
			if e.IsDir() {
				if err := walk(name); err != nil {
					return err
				}
				continue
			}
			f, err := fsys.Open(name)
			if err != nil {
				return err
			}
			data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
			f.Close()
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			total += len(data)
			if len(files) == maxFiles || total > maxBytes {
				return fmt.Errorf("more than %d files or %d bytes: not the jaeger-ui-rest this was written for", maxFiles, maxBytes)
			}
			files = append(files, file{name: strings.TrimPrefix(name, "/"), data: data})
		}
		return nil
	}
	if err := walk("/"); err != nil {
		return nil, err
	}
	return files, nil
}

// restoreIndex undoes jaegerui.FS's own configuration injection into
// index.html (it replaces Jaeger's placeholder with its Config, here the zero
// one), so that Jaeger's query extension stays in charge of the UI's
// configuration; then checks the page is one Jaeger can serve.
func restoreIndex(files []file) error {
	var index *file
	have := map[string]bool{}
	for i := range files {
		have[files[i].name] = true
		if files[i].name == "index.html" {
			index = &files[i]
		}
	}
	if index == nil {
		return errors.New("no index.html in the module's assets")
	}
	// The exact bytes jaegerui.Config.Inject writes.
	cfg, err := json.Marshal(jaegerui.Config{})
	if err != nil {
		return err
	}
	injected := "const JAEGER_CONFIG = " + string(cfg) + ";"
	if n := bytes.Count(index.data, []byte(injected)); n != 1 {
		return fmt.Errorf("index.html holds jaeger-ui-rest's injected configuration %d times, want once: %q", n, injected)
	}
	index.data = bytes.Replace(index.data, []byte(injected), []byte("const JAEGER_CONFIG = DEFAULT_CONFIG;"), 1)
	for _, p := range jaegerPatterns {
		if n := bytes.Count(index.data, []byte(p)); n != 1 {
			return fmt.Errorf("index.html holds %q %d times; Jaeger's query extension replaces it exactly once", p, n)
		}
	}
	refs := 0
	for _, tag := range assetTag.FindAll(index.data, -1) {
		m := assetRef.FindSubmatch(tag)
		if m == nil || bytes.Contains(tag, []byte(" nomodule")) {
			continue
		}
		refs++
		if !have[string(m[1])] {
			return fmt.Errorf("index.html needs %s, which the module does not hold", m[1])
		}
	}
	if refs == 0 {
		return errors.New("index.html names no ./static/ asset: not a built jaeger-ui")
	}
	return nil
}

// writeTar writes the files as an archive docker's ADD unpacks: directories
// 0755, files 0644, owned by root (the image runs as uid 65532, which only
// reads them), every entry at the same mtime.
func writeTar(dst string, files []file) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		if d := path.Dir(f.name); d != "." && !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	// Through a temporary name: make never sees half an archive as up to date.
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func writeDir(dir string, files []file) error {
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
