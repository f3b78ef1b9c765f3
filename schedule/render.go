package schedule

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MinTextWidth is the narrowest time axis RenderText accepts, in columns.
const MinTextWidth = 8

// RenderText writes the timeline as text, one row per rank, width columns of
// time per row. A pass is drawn as its letter (F, B, W; lower case f, b, w for
// chunks other than 0) followed by as many digits of its micro-batch number
// as fit in its columns; '.' is idle time. A header line gives the schedule,
// the costs, the makespan and the bubble, and a last column the rank's peak
// in-flight activations. Errors come from w, or name a width below
// MinTextWidth.
func (r Result) RenderText(w io.Writer, width int) error {
	if width < MinTextWidth {
		return fmt.Errorf("schedule: text width %d: need at least %d columns", width, MinTextWidth)
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%s p=%d m=%d v=%d  F=%s B=%s W=%s comm=%s  makespan %s  bubble %.2f%%\n",
		r.Kind, r.Stages, r.MicroBatches, r.Virtual, num(r.Costs.F), num(r.Costs.B), num(r.Costs.W), num(r.Costs.Comm),
		num(r.Makespan), 100*r.BubbleFraction)
	label := len(strconv.Itoa(len(r.Timeline) - 1))
	row := make([]byte, width)
	for rank, spans := range r.Timeline {
		for i := range row {
			row[i] = '.'
		}
		for _, sp := range spans {
			c0, c1 := r.columns(sp, width)
			cell := []byte(strconv.Itoa(sp.MicroBatch))
			letter := kindLetter(sp.Kind)
			if sp.Chunk > 0 {
				letter += 'a' - 'A'
			}
			row[c0] = letter
			for i := c0 + 1; i < c1; i++ {
				if d := i - c0 - 1; d < len(cell) {
					row[i] = cell[d]
				} else {
					row[i] = ' '
				}
			}
		}
		peak := ""
		if rank < len(r.PeakInFlight) {
			peak = fmt.Sprintf(" peak %d", r.PeakInFlight[rank])
		}
		fmt.Fprintf(bw, "rank %*d |%s|%s\n", label, rank, row, peak)
	}
	return bw.Flush()
}

// columns maps a span to the half-open column range [c0, c1) it covers on a
// width-column axis; every span gets at least one column.
func (r Result) columns(sp Span, width int) (c0, c1 int) {
	if r.Makespan <= 0 {
		return 0, 1
	}
	scale := float64(width) / r.Makespan
	c0 = min(int(math.Round(sp.Start*scale)), width-1)
	c1 = min(int(math.Round(sp.End*scale)), width)
	return c0, max(c1, c0+1)
}

func kindLetter(k OpKind) byte {
	switch k {
	case Forward:
		return 'F'
	case Backward:
		return 'B'
	case WeightGrad:
		return 'W'
	}
	return '?'
}

// num formats a time without trailing zeros.
func num(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

// SVG layout, in pixels.
const (
	svgLeft    = 64   // room for the rank labels
	svgTop     = 50   // room for the title line and the legend line under it
	svgRow     = 28   // height of one rank's row
	svgGap     = 6    // space between rows
	svgAxis    = 1000 // width of the time axis
	svgRight   = 16
	svgBottom  = 28 // room for the time ticks
	svgMinText = 5  // narrowest box that gets its micro-batch number
)

// Fill colours of F, B and W boxes for chunk 0; later chunks are lighter.
var svgFill = map[OpKind][3]float64{
	Forward:    {0x1f, 0x77, 0xb4},
	Backward:   {0x2c, 0xa0, 0x2c},
	WeightGrad: {0xff, 0x7f, 0x0e},
}

// RenderSVG writes the timeline as a standalone SVG document: one row per
// rank, a coloured box per pass (forward blue, backward green, weight
// gradient orange, lighter for later chunks) labelled with its micro-batch
// number when the box is wide enough, a title with the schedule, makespan and
// bubble, and a time axis. Errors come from w.
func (r Result) RenderSVG(w io.Writer) error {
	bw := bufio.NewWriter(w)
	rows := len(r.Timeline)
	width := svgLeft + svgAxis + svgRight
	height := svgTop + rows*(svgRow+svgGap) + svgBottom
	scale := 0.0
	if r.Makespan > 0 {
		scale = svgAxis / r.Makespan
	}
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(bw, `<title>%s pipeline schedule, p=%d m=%d v=%d</title>`+"\n", r.Kind, r.Stages, r.MicroBatches, r.Virtual)
	fmt.Fprintf(bw, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	u := r.timeUnit()
	fmt.Fprintf(bw, `<text x="%d" y="18" font-size="14">%s  %d stages, %d micro-batches, %d chunks per rank  forward %s  backward %s  weight %s  hop %s  makespan %s  bubble %.2f%%</text>`+"\n",
		svgLeft, r.Kind, r.Stages, r.MicroBatches, r.Virtual, u.format(r.Costs.F), u.format(r.Costs.B), u.format(r.Costs.W), u.format(r.Costs.Comm),
		u.format(r.Makespan), 100*r.BubbleFraction)
	// Legend, on its own line under the title: one swatch per pass kind.
	kinds := []OpKind{Forward, Backward}
	if r.Kind.SplitBackward() {
		kinds = append(kinds, WeightGrad)
	}
	for i, k := range kinds {
		x := svgLeft + 110*i
		fmt.Fprintf(bw, `<rect x="%d" y="28" width="12" height="12" fill="%s"/><text x="%d" y="38" font-size="11">%s</text>`+"\n",
			x, fill(k, 0, r.Virtual), x+16, k)
	}
	if r.Virtual > 1 {
		fmt.Fprintf(bw, `<text x="%d" y="38" font-size="11">later chunks lighter; box label: micro-batch</text>`+"\n", svgLeft+110*len(kinds))
	} else {
		fmt.Fprintf(bw, `<text x="%d" y="38" font-size="11">box label: micro-batch</text>`+"\n", svgLeft+110*len(kinds))
	}
	for rank, spans := range r.Timeline {
		y := svgTop + rank*(svgRow+svgGap)
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="end">rank %d</text>`+"\n", svgLeft-8, y+svgRow/2+4, rank)
		fmt.Fprintf(bw, `<rect x="%d" y="%d" width="%d" height="%d" fill="#eeeeee"/>`+"\n", svgLeft, y, svgAxis, svgRow)
		for _, sp := range spans {
			x := svgLeft + sp.Start*scale
			bwid := (sp.End - sp.Start) * scale
			fmt.Fprintf(bw, `<rect class="%s" x="%s" y="%d" width="%s" height="%d" fill="%s" stroke="#ffffff" stroke-width="0.5"><title>%s mb %d chunk %d [%s, %s)</title></rect>`+"\n",
				strings.ToLower(sp.Kind.String()), px(x), y, px(bwid), svgRow, fill(sp.Kind, sp.Chunk, r.Virtual),
				sp.Kind, sp.MicroBatch, sp.Chunk, num(sp.Start), num(sp.End))
			if bwid >= svgMinText {
				fmt.Fprintf(bw, `<text x="%s" y="%d" text-anchor="middle" fill="#ffffff" font-size="%d">%d</text>`+"\n",
					px(x+bwid/2), y+svgRow/2+4, max(5, min(12, int(bwid)-1)), sp.MicroBatch)
			}
		}
	}
	// Time axis: about ten ticks at round numbers.
	axisY := svgTop + rows*(svgRow+svgGap)
	fmt.Fprintf(bw, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000000"/>`+"\n", svgLeft, axisY, svgLeft+svgAxis, axisY)
	if r.Makespan > 0 {
		step := tickStep(r.Makespan)
		for t := 0.0; t <= r.Makespan*(1+1e-9); t += step {
			x := svgLeft + t*scale
			fmt.Fprintf(bw, `<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#000000"/>`+"\n", px(x), axisY, px(x), axisY+4)
			fmt.Fprintf(bw, `<text x="%s" y="%d" text-anchor="middle" font-size="10">%s</text>`+"\n", px(x), axisY+16, num(t*u.scale))
		}
	}
	fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="end" font-size="10">time (%s)</text>`+"\n", svgLeft-8, axisY+16, u.name)
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

// unit is how a renderer shows times: multiply by scale, append name.
type unit struct {
	scale float64
	name  string
}

// timeUnit picks ms or s for costs in seconds (ms under a 1 s makespan),
// and abstract "units" otherwise.
func (r Result) timeUnit() unit {
	switch {
	case !r.Costs.Seconds:
		return unit{1, "units"}
	case r.Makespan < 1:
		return unit{1e3, "ms"}
	}
	return unit{1, "s"}
}

// format writes x with the unit.
func (u unit) format(x float64) string {
	return strconv.FormatFloat(x*u.scale, 'g', 3, 64) + " " + u.name
}

// SVG returns RenderSVG's document as a string.
func (r Result) SVG() string {
	var sb strings.Builder
	_ = r.RenderSVG(&sb) // a strings.Builder never fails
	return sb.String()
}

// tickStep returns a round tick spacing (1, 2 or 5 times a power of ten)
// giving about ten ticks over span.
func tickStep(span float64) float64 {
	raw := span / 10
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, f := range []float64{1, 2, 5, 10} {
		if f*pow >= raw {
			return f * pow
		}
	}
	return 10 * pow
}

// fill returns the colour of a pass: its kind's colour, mixed with white by
// chunk/(v+1) so that later chunks are lighter.
func fill(k OpKind, chunk, v int) string {
	c := svgFill[k]
	mix := float64(chunk) / float64(v+1)
	var out [3]int
	for i := range c {
		out[i] = int(math.Round(c[i] + (255-c[i])*mix))
	}
	return fmt.Sprintf("#%02x%02x%02x", out[0], out[1], out[2])
}

func px(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
