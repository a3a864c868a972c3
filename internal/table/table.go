// Package table writes the aligned text tables that tenure's commands print
// (tenurectl and the dev cluster's story), so both render alike.
package table

import (
	"bytes"
	"io"
	"text/tabwriter"
)

// New is a tabwriter for a table of columns padded gap spaces apart. Lines
// are written without trailing blanks (an empty last cell would otherwise
// leave its column's padding behind).
func New(w io.Writer, gap int) *tabwriter.Writer {
	return tabwriter.NewWriter(&trimRight{w: w}, 0, 0, gap, ' ', 0)
}

// trimRight drops the blanks at the end of every line written through it.
type trimRight struct {
	w       io.Writer
	pending []byte // a partial line
}

func (t *trimRight) Write(p []byte) (int, error) {
	t.pending = append(t.pending, p...)
	for {
		i := bytes.IndexByte(t.pending, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := bytes.TrimRight(t.pending[:i], " \t")
		if _, err := t.w.Write(append(line, '\n')); err != nil {
			return 0, err
		}
		t.pending = t.pending[i+1:]
	}
}
