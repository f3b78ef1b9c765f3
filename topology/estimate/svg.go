package estimate

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/gpucoord/gpucoord/topology"
)

// svgMaxNodes bounds the nodes drawn in the rank grid.
const svgMaxNodes = 32

// WriteSVG draws the plan: the rank grid over the nodes (cell colour by
// pipeline stage, a darker band per TP group, each cell labelled with its
// rank and tp/pp/dp coordinates) above the simulated pipeline timeline.
func WriteSVG(w io.Writer, p *topology.Plan, r Report) error {
	const cell, gap, left, top = 46, 4, 90, 40
	cl, c := p.Cluster, p.Config
	nodes := min(cl.Nodes, svgMaxNodes)
	gridW := left + cl.GPUsPerNode*(cell+gap) + 20
	gridH := top + nodes*(cell+gap) + 30

	var tl bytes.Buffer
	if err := r.Timeline.RenderSVG(&tl); err != nil {
		return err
	}
	tlW, tlH := svgSize(tl.Bytes())
	width, height := max(gridW, tlW), gridH+tlH

	b := &bytes.Buffer{}
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="10">`+"\n", width, height, width, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text x="10" y="20" font-size="14">%s on %s: tp %d x pp %d x dp %d, order %s (colour: pipeline stage; band: TP group; label: rank, t/p/d)</text>`+"\n",
		p.Model.Name, cl.Name, c.TP, c.PP, c.DP, c.Order)
	for node := 0; node < nodes; node++ {
		y := top + node*(cell+gap)
		fmt.Fprintf(b, `<text x="10" y="%d">node %d</text>`+"\n", y+cell/2+4, node)
		for g := 0; g < cl.GPUsPerNode; g++ {
			rank := topology.Rank(node*cl.GPUsPerNode + g)
			co := p.Coord(rank)
			x := left + g*(cell+gap)
			hue := 360 * float64(co.PP) / float64(c.PP)
			tpGroup := int(p.Group(topology.AxisTP, rank)[0])
			fmt.Fprintf(b, `<rect class="gpu" x="%d" y="%d" width="%d" height="%d" fill="hsl(%.0f,65%%,%d%%)" stroke="#333333" stroke-width="0.5"><title>rank %d node %d gpu %d tp %d pp %d dp %d</title></rect>`+"\n",
				x, y, cell, cell, hue, 70+10*(co.DP%2), rank, node, g, co.TP, co.PP, co.DP)
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="6" fill="hsl(%d,40%%,35%%)"/>`+"\n", x, y+cell-6, cell, (tpGroup*47)%360)
			fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="11">%d</text>`+"\n", x+cell/2, y+16, rank)
			fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" font-size="9">%d/%d/%d</text>`+"\n", x+cell/2, y+30, co.TP, co.PP, co.DP)
		}
	}
	if cl.Nodes > nodes {
		fmt.Fprintf(b, `<text x="10" y="%d">... %d more nodes not drawn</text>`+"\n", top+nodes*(cell+gap)+14, cl.Nodes-nodes)
	}
	fmt.Fprintf(b, `<g transform="translate(0,%d)">`+"\n", gridH)
	b.Write(tl.Bytes())
	b.WriteString("</g>\n</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

var svgDims = regexp.MustCompile(`<svg[^>]*\swidth="(\d+)"[^>]*\sheight="(\d+)"`)

// svgSize reads the width and height of a standalone SVG document.
func svgSize(doc []byte) (w, h int) {
	m := svgDims.FindSubmatch(doc)
	if m == nil {
		return 0, 0
	}
	w, _ = strconv.Atoi(string(m[1]))
	h, _ = strconv.Atoi(string(m[2]))
	return w, h
}
