package table_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/internal/table"
)

func TestNewAlignsAndTrims(t *testing.T) {
	var b strings.Builder
	tw := table.New(&b, 2)
	fmt.Fprintln(tw, "A\tBB\tC")
	fmt.Fprintln(tw, "long\tx\t")
	tw.Flush()
	want := "A     BB  C\nlong  x\n"
	if b.String() != want {
		t.Errorf("table = %q, want %q", b.String(), want)
	}
}
