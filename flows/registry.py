"""Stage name -> flow, for the CLI and deployments."""
from flows.negative_ft import negative_ft_flow
from flows.pipeline import pipeline_flow
from flows.reward_model import reward_model_flow
from flows.rl import rl_flow
from flows.sft import sft_flow

FLOWS = {"sft": sft_flow, "reward-model": reward_model_flow, "rl": rl_flow,
         "negative-ft": negative_ft_flow, "pipeline": pipeline_flow}
