package schedule

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata")

// TestRenderTextGolden compares the text timelines with testdata/*.txt. Run
// `go test ./schedule -run TestRenderTextGolden -rewrite` after a deliberate
// change and review the diff.
func TestRenderTextGolden(t *testing.T) {
	tests := []struct {
		file    string
		kind    Kind
		p, m, v int
		c       Costs
		width   int
	}{
		{"gpipe_p4_m8.txt", GPipe, 4, 8, 1, Costs{F: 1, B: 2}, 99},
		{"1f1b_p4_m8.txt", OneFOneB, 4, 8, 1, Costs{F: 1, B: 2}, 99},
		{"interleaved_p4_m8_v2.txt", Interleaved, 4, 8, 2, Costs{F: 1, B: 2}, 114},
		{"zb-h1_p4_m8.txt", ZBH1, 4, 8, 1, Costs{F: 1, B: 1, W: 1}, 81},
		{"1f1b_p4_m8_comm.txt", OneFOneB, 4, 8, 1, Costs{F: 1, B: 2, Comm: 0.5}, 82},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			res := mustSimulate(t, tc.kind, tc.p, tc.m, tc.v, tc.c)
			var buf bytes.Buffer
			if err := res.RenderText(&buf, tc.width); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.file)
			if *rewrite {
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -rewrite to create it)", err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("RenderText mismatch (run with -rewrite and review the diff):\n got:\n%s\nwant:\n%s", got, want)
			}
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			if len(lines) != tc.p+1 {
				t.Errorf("%d lines, want a header and %d ranks", len(lines), tc.p)
			}
		})
	}
}

// TestRenderTextScale checks the column arithmetic on a case small enough to
// draw by hand: 1F1B p=2 m=2 with F=1, B=2 has makespan (m+p-1)(F+B) = 9 and
// bubble (p-1)/m = 50%; at 18 columns each time unit is two columns. Rank 0
// runs F0 [0,1) F1 [1,2) B0 [4,6) B1 [7,9); rank 1 F0 [1,2) B0 [2,4)
// F1 [4,5) B1 [5,7).
func TestRenderTextScale(t *testing.T) {
	res := mustSimulate(t, OneFOneB, 2, 2, 1, Costs{F: 1, B: 2})
	var buf bytes.Buffer
	if err := res.RenderText(&buf, 18); err != nil {
		t.Fatal(err)
	}
	want := "1f1b p=2 m=2 v=1  F=1 B=2 W=0 comm=0  makespan 9  bubble 50.00%\n" +
		"rank 0 |F0F1....B0  ..B1  | peak 2\n" +
		"rank 1 |..F0B0  F1B1  ....| peak 1\n"
	if got := buf.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderTextRejectsNarrow(t *testing.T) {
	res := mustSimulate(t, GPipe, 2, 2, 1, Costs{F: 1, B: 1})
	if err := res.RenderText(io.Discard, MinTextWidth-1); err == nil || !strings.Contains(err.Error(), "width 7") {
		t.Errorf("err = %v, want one naming width 7", err)
	}
}

type failWriter struct{}

var errWrite = errors.New("disk full")

func (failWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestRenderWriteErrors(t *testing.T) {
	res := mustSimulate(t, GPipe, 2, 2, 1, Costs{F: 1, B: 1})
	if err := res.RenderText(failWriter{}, 40); !errors.Is(err, errWrite) {
		t.Errorf("RenderText err = %v, want the writer's", err)
	}
	if err := res.RenderSVG(failWriter{}); !errors.Is(err, errWrite) {
		t.Errorf("RenderSVG err = %v, want the writer's", err)
	}
}

// TestRenderSVG parses the document and counts one box per pass, of the
// pass's kind, inside the drawing, plus a label per box wide enough.
func TestRenderSVG(t *testing.T) {
	for _, tc := range []struct {
		kind    Kind
		p, m, v int
		c       Costs
	}{
		{OneFOneB, 4, 8, 1, Costs{F: 1, B: 2}},
		{Interleaved, 4, 8, 2, Costs{F: 1, B: 2, Comm: 0.1}},
		{ZBH1, 4, 8, 1, Costs{F: 1, B: 1, W: 1}},
		{GPipe, 8, 64, 1, Costs{F: 1, B: 2}},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			res := mustSimulate(t, tc.kind, tc.p, tc.m, tc.v, tc.c)
			doc := res.SVG()
			dec := xml.NewDecoder(strings.NewReader(doc))
			counts := map[string]int{}
			labels := 0
			root := ""
			for {
				tok, err := dec.Token()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("SVG is not well-formed XML: %v", err)
				}
				se, ok := tok.(xml.StartElement)
				if !ok {
					continue
				}
				if root == "" {
					root = se.Name.Local
				}
				for _, a := range se.Attr {
					if se.Name.Local == "rect" && a.Name.Local == "class" {
						counts[a.Value]++
					}
					if se.Name.Local == "text" && a.Name.Local == "fill" && a.Value == "#ffffff" {
						labels++
					}
				}
			}
			if root != "svg" {
				t.Errorf("root element %q, want svg", root)
			}
			want := map[string]int{"forward": tc.m * tc.v * tc.p, "backward": tc.m * tc.v * tc.p}
			if tc.kind.SplitBackward() {
				want["weightgrad"] = tc.m * tc.p
			}
			for k, n := range want {
				if counts[k] != n {
					t.Errorf("%d %s boxes, want %d", counts[k], k, n)
				}
			}
			wide := 0
			for _, row := range res.Timeline {
				for _, sp := range row {
					if (sp.End-sp.Start)*svgAxis/res.Makespan >= svgMinText {
						wide++
					}
				}
			}
			if labels != wide {
				t.Errorf("%d micro-batch labels, want %d (one per box at least %d px wide)", labels, wide, svgMinText)
			}
			if !strings.Contains(doc, "bubble") || !strings.Contains(doc, string(tc.kind)) {
				t.Errorf("SVG title lacks the kind or the bubble")
			}
		})
	}
}

func TestTickStep(t *testing.T) {
	for _, tc := range []struct{ span, want float64 }{{33, 5}, {8, 1}, {100, 10}, {0.5, 0.05}, {1500, 200}} {
		if got := tickStep(tc.span); got != tc.want {
			t.Errorf("tickStep(%v) = %v, want %v", tc.span, got, tc.want)
		}
	}
}

// TestRenderZeroResult renders a Result nobody filled in: no rows, no panic.
func TestRenderZeroResult(t *testing.T) {
	var res Result
	var buf bytes.Buffer
	if err := res.RenderText(&buf, 20); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != 1 {
		t.Errorf("%d lines for an empty result, want only the header", lines)
	}
	if doc := res.SVG(); !strings.HasPrefix(doc, "<svg") || !strings.HasSuffix(doc, "</svg>\n") {
		t.Errorf("empty result SVG is not a document: %q", doc)
	}
}

// TestRenderSVGLabels: the title and the legend do not share a line, times
// carry their unit (ms for a planner's seconds under one second, "units"
// for abstract costs) and the time axis is labelled.
func TestRenderSVGLabels(t *testing.T) {
	for _, tc := range []struct {
		c         Costs
		unit, axe string
	}{
		{Costs{F: 0.002, B: 0.004, Comm: 0.0001, Seconds: true}, "ms", "time (ms)"},
		{Costs{F: 1, B: 2}, "units", "time (units)"},
	} {
		res := mustSimulate(t, OneFOneB, 4, 8, 1, tc.c)
		dec := xml.NewDecoder(strings.NewReader(res.SVG()))
		var texts []struct{ y, body string }
		var cur *struct{ y, body string }
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			switch v := tok.(type) {
			case xml.StartElement:
				if v.Name.Local == "text" {
					texts = append(texts, struct{ y, body string }{})
					cur = &texts[len(texts)-1]
					for _, a := range v.Attr {
						if a.Name.Local == "y" {
							cur.y = a.Value
						}
					}
				}
			case xml.CharData:
				if cur != nil {
					cur.body += string(v)
				}
			case xml.EndElement:
				cur = nil
			}
		}
		var titleY string
		legendYs := map[string]bool{}
		axis := false
		for _, tx := range texts {
			switch {
			case strings.Contains(tx.body, "makespan"):
				titleY = tx.y
				if !strings.Contains(tx.body, "makespan "+strconv.FormatFloat(res.Makespan*map[string]float64{"ms": 1e3, "units": 1}[tc.unit], 'g', 3, 64)+" "+tc.unit) {
					t.Errorf("title %q: makespan without its unit %s", tx.body, tc.unit)
				}
			case tx.body == Forward.String() || tx.body == Backward.String():
				legendYs[tx.y] = true
			case tx.body == tc.axe:
				axis = true
			}
		}
		if titleY == "" || legendYs[titleY] || len(legendYs) == 0 {
			t.Errorf("title at y=%s, legend at %v: want them on different lines", titleY, legendYs)
		}
		if !axis {
			t.Errorf("no axis label %q", tc.axe)
		}
	}
}
