// placeholder: the policy helper writes this file
