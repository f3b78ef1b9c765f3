package gpucoordpb

import "fmt"

// Grid is the part of a layout a re-plan may change besides dp: tensor-
// and pipeline-parallel degrees, virtual stages per pipeline rank (0: the
// schedule's default, as in the spec) and the ZeRO stage.
type Grid struct {
	TP, PP, VPP, Zero int32
}

// SpecGrid is the layout a job was submitted with.
func SpecGrid(spec *JobSpec) Grid {
	return Grid{TP: max(spec.GetTp(), 1), PP: max(spec.GetPp(), 1), VPP: spec.GetVpp(), Zero: spec.GetZero()}
}

// GenerationGrid is the layout generation g runs: its own when it has one
// (a re-planned generation), else the spec's. It is the one place that
// says which, for the coordinator, the agents and every client.
func GenerationGrid(spec *JobSpec, g *Generation) Grid {
	if g.GetTp() == 0 {
		return SpecGrid(spec)
	}
	return Grid{TP: g.GetTp(), PP: g.GetPp(), VPP: g.GetVpp(), Zero: g.GetZero()}
}

// ResumeGrid is the layout that wrote generation g's resume step: the one
// g records, else g's own.
func ResumeGrid(spec *JobSpec, g *Generation) Grid {
	own := GenerationGrid(spec, g)
	if g.GetResumeTp() == 0 {
		return own
	}
	return Grid{TP: g.GetResumeTp(), PP: g.GetResumePp(), VPP: g.GetResumeVpp(), Zero: own.Zero}
}

// StepGrid is the layout that trained step s of a job (a commit's).
func StepGrid(spec *JobSpec, s *Step) Grid {
	if s.GetTp() == 0 {
		return SpecGrid(spec)
	}
	return Grid{TP: s.GetTp(), PP: s.GetPp(), VPP: s.GetVpp(), Zero: spec.GetZero()}
}

// Label is "tp 2 pp 4 dp 2" with dp, adding "vpp V" above 1 and "zero Z"
// above 0.
func (g Grid) Label(dp int32) string {
	s := fmt.Sprintf("tp %d pp %d dp %d", g.TP, g.PP, dp)
	if g.VPP > 1 {
		s += fmt.Sprintf(" vpp %d", g.VPP)
	}
	if g.Zero > 0 {
		s += fmt.Sprintf(" zero %d", g.Zero)
	}
	return s
}
