// Package webui holds the assets every Phalanx web page shares, embedded
// in the binary: the pinned charting library uPlot (fetched by
// scripts/vendor-uplot, its files' SHA-256 in assets/SOURCE) and
// Phalanx's own charts over it (assets/charts.js: a curve by step or by
// time with its generations shaded and its events marked).
// Pages need no network: the status page loads them from Handler, a
// self-contained report inlines them (Inline).
package webui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// scripts and styles, in the order a page loads them.
var (
	scripts = [...]string{"uPlot.iife.min.js", "charts.js"}
	styles  = [...]string{"uPlot.min.css", "charts.css"}
)

// FS is the assets, at their names ("uPlot.iife.min.js", ...).
func FS() fs.FS {
	sub, _ := fs.Sub(assets, "assets") // the directory is embedded: no error
	return sub
}

// Handler serves the assets under the path it is mounted at (with
// http.StripPrefix).
func Handler() http.Handler { return http.FileServerFS(FS()) }

// Head is the tags that load the assets from prefix (e.g. "/assets/").
func Head(prefix string) string {
	var b strings.Builder
	for _, s := range styles {
		b.WriteString(`<link rel="stylesheet" href="` + prefix + s + `">` + "\n")
	}
	for _, s := range scripts {
		b.WriteString(`<script src="` + prefix + s + `"></script>` + "\n")
	}
	return b.String()
}

// Inline is the assets as tags of a self-contained page: styles and
// scripts in full.
func Inline() string {
	var b strings.Builder
	for _, s := range styles {
		c, _ := fs.ReadFile(FS(), s)
		b.WriteString("<style>\n" + string(c) + "\n</style>\n")
	}
	for _, s := range scripts {
		c, _ := fs.ReadFile(FS(), s)
		// A script holds no "</script": uPlot's and ours are checked by
		// TestVendoredAssets.
		b.WriteString("<script>\n" + string(c) + "\n</script>\n")
	}
	return b.String()
}
